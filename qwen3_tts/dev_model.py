"""``qwen3-tts make-dev-model``: a small random checkpoint in the official on-disk layout.

It is the embedded default of ``qwen3-tts up`` and the docker image when no released checkpoint is
mounted, and a test input: it is written exactly like a release (config.json,
generation_config.json, model.safetensors in bf16, tokenizer files, speech_tokenizer/ with the
Mimi encoder and the decoder in fp32) and loads back through the same code paths. The weights are
random (seeded): the audio is noise-like, but every stage, shape and id path is exercised.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from decoder_service.model.decoder import CodecDecoder
from speaker_service.model.codec_encoder import CodecEncoder
from speaker_service.model.speaker_encoder import SpeakerEncoder
from talker_service.model.talker import Talker
from tts_common.config import Qwen3TTSConfig, SpeechTokenizerConfig
from tts_common.release_dims import (
    decoder_config_dict,
    encoder_config_dict,
    model_config_dict,
    speech_tokenizer_config_dict,
    talker_config_dict,
)

from .checkpoint_files import write_checkpoint

ASSETS = Path(__file__).parent / "dev_assets"
MODEL_TYPES = ("custom_voice", "base", "voice_design")
GENERATION_CONFIG = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}
EOS_LOGIT_SCALE = 2.0
"""The EOS row of the codec head is scaled so random dev models end utterances within a few
seconds instead of running to the frame budget."""


def _special_ids() -> dict[str, int]:
    with open(ASSETS / "tokenizer_config.json", encoding="utf-8") as fh:
        added = json.load(fh)["added_tokens_decoder"]
    return {entry["content"]: int(i) for i, entry in added.items()}


SIZES = ("dev", "0b6", "1b7")
"""``dev``: tiny widths; ``0b6`` / ``1b7``: the released dimensions (random weights at real size,
for benchmarks; the text vocabulary is still the shipped compact one)."""


def dev_model_config(model_type: str, size: str = "dev") -> dict[str, Any]:
    """``config.json`` of the dev checkpoint (tiny dims, or the released ones for ``size`` 0b6 /
    1b7; release ids, the shipped compact vocab)."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model type must be one of {MODEL_TYPES}, got {model_type!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    config = _tiny_model_config(model_type)
    if size != "dev":
        release = model_config_dict(size, model_type)
        # the tiny talker is the release one with small dims: at release size, it is the release one
        config["talker_config"] = release["talker_config"]
        config["speaker_encoder_config"] = release["speaker_encoder_config"]
        config["tts_model_size"] = size
    return config


def _tiny_model_config(model_type: str) -> dict[str, Any]:
    ids = _special_ids()
    talker = talker_config_dict("1b7", model_type) | {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "text_hidden_size": 32,
        "text_vocab_size": 2560,
        "rope_scaling": {"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"},
    }
    talker["code_predictor_config"] = talker["code_predictor_config"] | {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
    }
    config: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "1b7",
        "tts_model_type": model_type,
        "im_start_token_id": ids["<|im_start|>"],
        "im_end_token_id": ids["<|im_end|>"],
        "tts_pad_token_id": ids["<tts_pad>"],
        "tts_bos_token_id": ids["<tts_text_bos>"],
        "tts_eos_token_id": ids["<tts_text_eod>"],
        "talker_config": talker,
        "speaker_encoder_config": {
            "enc_dim": 64,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_attention_channels": 16,
            "enc_se_channels": 16,
            "sample_rate": 24000,
        },
    }
    return config


def dev_speech_tokenizer_config(size: str = "dev") -> dict[str, Any]:
    """``speech_tokenizer/config.json`` of the dev checkpoint (the release one for 0b6 / 1b7)."""
    if size != "dev":
        return speech_tokenizer_config_dict()
    return _tiny_speech_tokenizer_config()


def _tiny_speech_tokenizer_config() -> dict[str, Any]:
    """``speech_tokenizer/config.json``: the real 1920x upsampling chain at small widths."""
    encoder = encoder_config_dict() | {
        "hidden_size": 32,
        "num_filters": 4,
        "codebook_dim": 16,
        "vector_quantization_hidden_dimension": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 64,
        "upsample_groups": 32,
    }
    # The release decoder with small widths (the same 1920x upsampling chain and window).
    decoder = decoder_config_dict() | {
        "codebook_dim": 32,
        "hidden_size": 32,
        "intermediate_size": 64,
        "head_dim": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "latent_dim": 32,
        "decoder_dim": 64,
        "vector_quantization_hidden_dimension": 16,
    }
    return speech_tokenizer_config_dict() | {"encoder_config": encoder, "decoder_config": decoder}


def _init_like_release(module: torch.nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) for matrices and embeddings, zero biases, unit norms (HF-style init)."""
    for name, param in module.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.zeros_(param)
        elif param.dim() == 1:
            torch.nn.init.ones_(param)
        else:
            torch.nn.init.normal_(param, std=std)


def _talker_state(config: Qwen3TTSConfig) -> dict[str, torch.Tensor]:
    talker = Talker(config.talker)
    _init_like_release(talker, std=0.3)
    with torch.no_grad():
        talker.codec_head.weight[config.talker.codec_eos_token_id] *= EOS_LOGIT_SCALE
    return {f"talker.{k}": v.to(torch.bfloat16).contiguous() for k, v in talker.state_dict().items()}


def _decoder_state(config: SpeechTokenizerConfig) -> dict[str, torch.Tensor]:
    decoder = CodecDecoder(config.decoder)
    with torch.no_grad():
        for name, tensor in decoder.state_dict().items():
            if name.endswith("cluster_usage"):
                tensor.fill_(1.0)
            elif name.endswith("embedding_sum"):
                tensor.normal_(std=1.0)
    return {f"decoder.{k}": v.float().contiguous() for k, v in decoder.state_dict().items()}


def make_dev_model(
    path: str | Path,
    model_type: str = "custom_voice",
    seed: int = 1234,
    if_missing: bool = False,
    size: str = "dev",
) -> Path:
    """Write the dev checkpoint to ``path`` (created); returns the path.

    ``if_missing``: leave an existing checkpoint (a ``config.json`` in ``path``) untouched.
    ``size``: ``dev`` (tiny) or ``0b6`` / ``1b7`` (released dimensions, random weights; a few GB).
    Written as :func:`qwen3_tts.checkpoint_files.write_checkpoint` writes (config.json last).
    """
    return write_checkpoint(
        path,
        lambda folder: _write_checkpoint(folder, model_type, seed, size),
        staging_prefix=".dev-model-",
        if_missing=if_missing,
    )


def _write_checkpoint(folder: Path, model_type: str, seed: int, size: str) -> None:
    """Every file of the dev checkpoint, written into the empty ``folder``."""
    model_cfg_dict = dev_model_config(model_type, size)
    st_cfg_dict = dev_speech_tokenizer_config(size)
    model_cfg = Qwen3TTSConfig.from_dict(model_cfg_dict)
    st_cfg = SpeechTokenizerConfig.from_dict(st_cfg_dict)
    (folder / "speech_tokenizer").mkdir()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        main = _talker_state(model_cfg)
        if model_type == "base":
            assert model_cfg.speaker_encoder is not None
            spk = SpeakerEncoder.random_state_dict(model_cfg.speaker_encoder, seed=seed)
            main |= {k: v.to(torch.bfloat16).contiguous() for k, v in spk.items()}
        tokenizer_state = _decoder_state(st_cfg)
        tokenizer_state |= CodecEncoder.random_state_dict(st_cfg.encoder_config, seed=seed)
    save_file(main, str(folder / "model.safetensors"), metadata={"format": "pt"})
    save_file(
        {k: v.contiguous() for k, v in tokenizer_state.items()},
        str(folder / "speech_tokenizer" / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_text(json.dumps(model_cfg_dict | {"dtype": "bfloat16"}, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    (folder / "speech_tokenizer" / "config.json").write_text(
        json.dumps(st_cfg_dict | {"dtype": "float32"}, indent=2)
    )
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(ASSETS / name, folder / name)
    shutil.copy(ASSETS / "preprocessor_config.json", folder / "speech_tokenizer" / "preprocessor_config.json")
    (folder / "dev_model.json").write_text(
        json.dumps({"type": model_type, "seed": seed, "random": True, "size": size}, indent=2)
    )
