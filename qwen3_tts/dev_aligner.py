"""A small random Qwen3-ForcedAligner checkpoint in the released on-disk layout (issue 24).

The dev aligner is to the aligner stage what :mod:`qwen3_tts.dev_model` is to the TTS stages: the
embedded default of ``qwen3-tts up`` (``make up``) when no released aligner is given, written
exactly like a release (``config.json`` with ``thinker_config.model_type`` ``qwen3_forced_aligner``,
bf16 ``model.safetensors`` with ``thinker.*`` keys, ``vocab.json``, ``merges.txt``,
``tokenizer_config.json`` with ``extra_special_tokens``, ``preprocessor_config.json``) and loaded
through the same code. Tiny widths and the shipped compact vocabulary (the TTS dev vocabulary,
with the aligner's special tokens at the release's offsets from the first special token).

Timestamp structure. With the official initialisation every ``<timestamp>`` predicts about the
same class, so every word would land at one time. :func:`structure_timestamp_weights` overwrites
a few weights (the rest stays random) so that the class at a timestamp position is about
``round(K * n_ts / d)``: ``n_ts`` the timestamps up to that position and ``d`` either the audio
embeddings (``per="audio"``, 13 per second: the fixture's choice, so the audio length matters) or
1 (``per="word"``: the dev checkpoint, a fixed pace per word). How, with hidden channels 0-5
reserved as signal channels:

* token embeddings: channel 0 = 1 for ``<timestamp>``, channel 1 = 1 for ``<|audio_start|>``;
  audio embeddings (``proj2`` bias, with a faint random row so the audio content matters):
  channel 4 = ~1; the other signal channels 0;
* layer 0 attention: ``q_proj = 0``, so every head averages uniformly over its causal prefix;
  ``v_proj`` rows 0 and 1 (KV head 0) read the normalised channel 0 and the denominator's channel
  (4, or 1: its mean is 1 / position, as ``<|audio_start|>`` comes once), and ``o_proj`` writes
  them K times into channel 2 and once into channels 3 and 5, so channel 2 / channel 3 =
  K * n_ts / d (the RMSNorm scales cancel or are compensated);
* every ``o_proj`` and MLP ``down_proj`` leaves channels 0-5 alone otherwise;
* ``lm_head`` row c = ``2c`` on channel 2 and ``-c^2`` on channels 3 + 5 (split in two bf16-exact
  parts), so ``logit_c = ch3 * (2 c r - c^2)``, r = ch2 / ch3, whose argmax is ``round(r)``; its
  other columns stay random, so the logits (and near ties, the classes) depend on the whole
  network.

So classes grow with the word index (start <= end <= next start, up to the random part). The dev
checkpoint puts a word every 400 ms (:data:`DEV_K`), which can run past the end of short audio:
the weights are random, only the plumbing is real.

The fixture builder ``scripts/aligner_fixtures.py`` (run in the official package's environment)
applies the same structure to a checkpoint built with the official classes; this module imports
nothing from the project at import time for that reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

ASSETS = Path(__file__).parent / "dev_assets"
SPECIAL_OFFSETS = {
    0: "<|endoftext|>",
    26: "<|audio_start|>",
    27: "<|audio_end|>",
    33: "<|audio_pad|>",
    62: "<timestamp>",
}
"""Offsets from the first special token (151 643 in the release) of the special tokens the aligner
uses: ``<|audio_start|>`` 151 669, ``<|audio_end|>`` 151 670, ``<|audio_pad|>`` 151 676 (the
release's ``audio_token_id``), ``<timestamp>`` 151 705 (``timestamp_token_id``). Offsets 1-25 take
the names of the TTS dev vocabulary (the Qwen3 layout); the others are named
``<|aligner_reserved_N|>`` (their release names are unverified and unused)."""
SPECIAL_COUNT = 64
TEXT_VOCAB_SIZE = 2560
SIGNAL_CHANNELS = 6
DEV_K = 2.5
"""Classes per ``<timestamp>`` of the dev checkpoint (``per="word"``): a word every 2 x 2.5 x 80
= 400 ms (150 words a minute), each 200 ms long."""
DEV_SHARPNESS = 256.0
"""How much the dev checkpoint's structure outweighs its random part (the mean of the
once-per-prompt ``<|audio_start|>`` channel is small, so its curvature needs the help)."""
DEV_CLASSIFY_NUM = 5000


def aligner_tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json`` of the compact aligner vocabulary (the TTS dev vocabulary's
    regular tokens; the aligner's specials at their release offsets; the audio tokens under
    ``extra_special_tokens``, the only place the official processor looks for them)."""
    with open(ASSETS / "tokenizer_config.json", encoding="utf-8") as fh:
        tts = json.load(fh)
    tts_added = {int(k): v["content"] for k, v in tts["added_tokens_decoder"].items()}
    first = min(tts_added)
    added = {}
    for offset in range(SPECIAL_COUNT):
        name = SPECIAL_OFFSETS.get(offset) or (
            tts_added.get(first + offset) if offset < 26 else f"<|aligner_reserved_{offset}|>"
        )
        added[str(first + offset)] = {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    config = {k: v for k, v in tts.items() if k != "added_tokens_decoder"}
    config["added_tokens_decoder"] = added
    config["extra_special_tokens"] = {
        "audio_token": "<|audio_pad|>",
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
    }
    return config


def special_id(name: str) -> int:
    """Id of one of :data:`SPECIAL_OFFSETS`' tokens in the compact vocabulary."""
    config = aligner_tokenizer_config()
    return next(int(k) for k, v in config["added_tokens_decoder"].items() if v["content"] == name)


PREPROCESSOR_CONFIG = {
    "chunk_length": 30,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "processor_class": "Qwen3ASRProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
}
"""``preprocessor_config.json``: Whisper log-mel features, 16 kHz, 128 bands (§12)."""


def tiny_aligner_config(classify_num: int = DEV_CLASSIFY_NUM) -> dict[str, Any]:
    """``config.json`` of a tiny aligner: the release's structure and fields, small widths, the
    compact vocabulary's ids."""
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "timestamp_token_id": special_id("<timestamp>"),
        "timestamp_segment_time": 80,
        "support_languages": ["Chinese", "English", "Japanese", "Korean", "German", "French", "Spanish"],
        "thinker_config": {
            "model_type": "qwen3_forced_aligner",
            "classify_num": classify_num,
            "audio_token_id": special_id("<|audio_pad|>"),
            "audio_start_token_id": special_id("<|audio_start|>"),
            "audio_end_token_id": special_id("<|audio_end|>"),
            "audio_config": {
                "num_mel_bins": 128,
                "d_model": 32,
                "encoder_layers": 2,
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "activation_function": "gelu",
                "downsample_hidden_size": 8,
                "output_dim": 64,
                "n_window": 50,
                "n_window_infer": 800,
                "max_source_positions": 1500,
                "conv_chunksize": 500,
                "scale_embedding": False,
            },
            "text_config": {
                "model_type": "qwen3_asr_text",
                "vocab_size": TEXT_VOCAB_SIZE,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "hidden_act": "silu",
                "max_position_embeddings": 65536,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "rope_scaling": {"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"},
                "attention_bias": False,
                "tie_word_embeddings": False,
            },
        },
        "transformers_version": "4.57.6",
    }


def _bf16_split(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values = hi + lo with hi and lo both exact in bf16 (values up to 16 significant bits)."""
    hi = values.to(torch.bfloat16).float()
    return hi, values - hi


def structure_timestamp_weights(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    k: float,
    per: str = "audio",
    sharpness: float = 1.0,
) -> None:
    """Give the random ``thinker.*`` weights of ``state`` (in place) the timestamp structure of
    the module docstring; ``config`` is the checkpoint's ``config.json`` dict. ``per="audio"``:
    class ~ K * n_timestamps / n_audio_embeddings; ``per="word"``: class ~ K * n_timestamps (the
    mean of a channel set on ``<|audio_start|>`` alone is 1 / position, so the ratio is a count).
    ``sharpness`` (a power of two keeps the rows bf16-exact) scales the structured ``lm_head``
    columns against its random ones: the larger, the less the random part moves the classes."""
    if per not in ("audio", "word"):
        raise ValueError(f"per must be 'audio' or 'word', got {per!r}")
    thinker = config["thinker_config"]
    text = thinker["text_config"]
    ts, start = config["timestamp_token_id"], thinker["audio_start_token_id"]
    sig = SIGNAL_CHANNELS
    with torch.no_grad():
        emb = state["thinker.model.embed_tokens.weight"]
        emb[:, :sig] = 0.0
        emb[ts, 0] = 1.0  # channel 0: is-timestamp
        emb[start, 1] = 1.0  # channel 1: is-audio-start
        w2, b2 = state["thinker.audio_tower.proj2.weight"], state["thinker.audio_tower.proj2.bias"]
        audio_row = w2[4] * 0.25  # channel 4 (is-audio) keeps a trace of the audio content
        w2[:sig] = 0.0
        b2[:sig] = 0.0
        w2[4] = audio_row
        b2[4] = 1.0
        # The signal channels pass the norms unscaled (channels 3 and 5 must stay equal).
        state["thinker.model.norm.weight"][:sig] = 1.0
        state["thinker.model.layers.0.input_layernorm.weight"][:sig] = 1.0
        for layer in range(text["num_hidden_layers"]):
            p = f"thinker.model.layers.{layer}."
            state[p + "self_attn.o_proj.weight"][:sig] = 0.0
            state[p + "mlp.down_proj.weight"][:sig] = 0.0
        p = "thinker.model.layers.0.self_attn."
        state[p + "q_proj.weight"].zero_()
        v = state[p + "v_proj.weight"]
        v[:2] = 0.0
        v[0, 0] = 1.0  # KV head 0, dim 0 <- normalised channel 0 (is-timestamp)
        gain = k
        if per == "audio":
            v[1, 4] = 1.0  # KV head 0, dim 1 <- normalised channel 4 (is-audio)
        else:
            v[1, 1] = 1.0  # KV head 0, dim 1 <- normalised channel 1 (is-audio-start)
            # the two tokens' RMSNorm scales differ: make the ratio exactly K * count
            gain = k * float(emb[ts].pow(2).mean().sqrt() / emb[start].pow(2).mean().sqrt())
        o = state[p + "o_proj.weight"]
        o[:, :2] = 0.0
        o[2, 0] = gain  # query head 0 reads KV head 0: channel 2 = K * mean(is-timestamp)
        o[3, 1] = 1.0  # channels 3 and 5 = the mean of the denominator channel
        o[5, 1] = 1.0
        head = state["thinker.lm_head.weight"]
        classes = torch.arange(head.shape[0], dtype=torch.float32)
        hi, lo = _bf16_split(classes * classes)
        head[:, :sig] = 0.0
        head[:, 2] = 2.0 * classes * sharpness
        head[:, 3] = -hi * sharpness
        head[:, 5] = -lo * sharpness


def random_aligner_state(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded random fp32 tensors for the ``thinker.*`` keys of ``shapes`` (name -> shape, in
    the given order): matrices and convolutions N(0, 1/fan_in) (so every part of the network
    moves the logits, unlike the official init's N(0, 0.02)), embeddings N(0, 1), biases
    N(0, 0.02), norm weights 1 + N(0, 0.1) (so a missing bias or norm weight shows)."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name.endswith("bias"):
            value = torch.randn(shape, generator=generator) * 0.02
        elif len(shape) == 1:
            value = 1.0 + torch.randn(shape, generator=generator) * 0.1
        elif name.endswith("embed_tokens.weight"):
            value = torch.randn(shape, generator=generator)
        else:
            fan_in = 1
            for dim in shape[1:]:
                fan_in *= dim
            value = torch.randn(shape, generator=generator) / fan_in**0.5
        state[name] = value
    return state


def write_tokenizer_files(folder: Path) -> None:
    """``vocab.json``, ``merges.txt``, ``tokenizer_config.json``, ``preprocessor_config.json``."""
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(ASSETS / name, folder / name)
    (folder / "tokenizer_config.json").write_text(json.dumps(aligner_tokenizer_config(), indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))


def make_dev_aligner(path: str | Path, seed: int = 1234, if_missing: bool = False) -> Path:
    """Write the dev aligner checkpoint to ``path`` (created); returns the path.

    ``if_missing``: leave an existing checkpoint (a ``config.json`` in ``path``) untouched. Like
    the dev TTS model it is written into a staging folder and moved into place with
    ``config.json`` last (:func:`qwen3_tts.checkpoint_files.write_checkpoint`), so an interrupted
    write reads as no checkpoint.
    """
    from safetensors.torch import save_file

    from aligner_service.model.config import ForcedAlignerConfig
    from aligner_service.model.text_model import AlignerThinker
    from qwen3_tts.checkpoint_files import write_checkpoint

    def write(folder: Path) -> None:
        config = tiny_aligner_config()
        with torch.device("meta"):
            thinker = AlignerThinker(ForcedAlignerConfig.from_dict(config))
        shapes = {f"thinker.{k}": tuple(v.shape) for k, v in thinker.state_dict().items()}
        state = random_aligner_state(shapes, seed)
        structure_timestamp_weights(state, config, DEV_K, per="word", sharpness=DEV_SHARPNESS)
        save_file(
            {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()},
            str(folder / "model.safetensors"),
            metadata={"format": "pt"},
        )
        write_tokenizer_files(folder)
        (folder / "dev_aligner.json").write_text(
            json.dumps({"seed": seed, "random": True, "k": DEV_K, "per": "word"})
        )
        (folder / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}, indent=2))

    return write_checkpoint(path, write, staging_prefix=".dev-aligner-", if_missing=if_missing)
