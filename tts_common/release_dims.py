"""Dimensions of the released Qwen3-TTS 12 Hz checkpoints (ARCHITECTURE.md §2, §3, §11).

Used where no released checkpoint is at hand: benchmarks at real size with random weights, and
tests that check our modules against the released parameter names and shapes on the meta
device. Serving never uses these: it reads every value from the checkpoint's own files.
"""

from __future__ import annotations

from typing import Any

from .config import (
    CodecDecoderConfig,
    Qwen3TTSConfig,
    SpeakerEncoderConfig,
    SpeechTokenizerConfig,
    TalkerConfig,
)

LANGUAGE_IDS = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
}
CUSTOM_VOICE_DIALECT_IDS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
CUSTOM_VOICE_SPEAKER_IDS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
CUSTOM_VOICE_DIALECTS: dict[str, str | bool] = dict.fromkeys(CUSTOM_VOICE_SPEAKER_IDS, False) | {
    "dylan": "beijing_dialect",
    "eric": "sichuan_dialect",
}


def talker_config_dict(size: str, model_type: str) -> dict[str, Any]:
    """``talker_config`` of a release checkpoint (``size`` "0b6" or "1b7")."""
    hidden = {"0b6": 1024, "1b7": 2048}[size]
    custom = model_type == "custom_voice"
    return {
        "vocab_size": 3072,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "attention_bias": False,
        "num_code_groups": 16,
        "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "text_vocab_size": 151936,
        "text_hidden_size": 2048,
        "position_id_per_seconds": 13,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_language_id": LANGUAGE_IDS | (CUSTOM_VOICE_DIALECT_IDS if custom else {}),
        "spk_id": dict(CUSTOM_VOICE_SPEAKER_IDS) if custom else {},
        "spk_is_dialect": dict(CUSTOM_VOICE_DIALECTS) if custom else {},
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 5,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "hidden_act": "silu",
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "attention_bias": False,
            "num_code_groups": 16,
        },
    }


def model_config_dict(size: str, model_type: str) -> dict[str, Any]:
    """A release ``config.json`` (as a dict) for ``size`` and ``model_type``."""
    hidden = {"0b6": 1024, "1b7": 2048}[size]
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": size,
        "tts_model_type": model_type,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "assistant_token_id": 77091,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "speaker_encoder_config": {"enc_dim": hidden, "sample_rate": 24000},
        "talker_config": talker_config_dict(size, model_type),
    }


def decoder_config_dict() -> dict[str, Any]:
    """``decoder_config`` of the released speech tokenizer."""
    return {
        "codebook_size": 2048,
        "codebook_dim": 512,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "head_dim": 64,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_hidden_layers": 8,
        "latent_dim": 1024,
        "decoder_dim": 1536,
        "sliding_window": 72,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "max_position_embeddings": 8000,
        "layer_scale_initial_scale": 0.01,
        "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "num_semantic_quantizers": 1,
        "semantic_codebook_size": 4096,
        "vector_quantization_hidden_dimension": 512,
    }


def encoder_config_dict() -> dict[str, Any]:
    """``encoder_config`` (transformers MimiConfig fields) of the released speech tokenizer."""
    return {
        "model_type": "mimi",
        "frame_rate": 12.5,
        "sampling_rate": 24000,
        "audio_channels": 1,
        "hidden_size": 512,
        "num_filters": 64,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": 2048,
        "codebook_dim": 256,
        "vector_quantization_hidden_dimension": 256,
        "num_quantizers": 32,
        "num_semantic_quantizers": 1,
        "upsample_groups": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2048,
        "hidden_act": "gelu",
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "use_cache": False,
        "use_streaming": False,
    }


def speech_tokenizer_config_dict() -> dict[str, Any]:
    """A release ``speech_tokenizer/config.json`` (as a dict)."""
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "encoder_config": encoder_config_dict(),
        "decoder_config": decoder_config_dict(),
    }


def release_model_config(size: str, model_type: str) -> Qwen3TTSConfig:
    return Qwen3TTSConfig.from_dict(model_config_dict(size, model_type))


def release_talker_config(size: str, model_type: str = "custom_voice") -> TalkerConfig:
    return TalkerConfig.from_dict(talker_config_dict(size, model_type))


def release_speaker_encoder_config(size: str) -> SpeakerEncoderConfig:
    cfg = release_model_config(size, "base").speaker_encoder
    assert cfg is not None
    return cfg


def release_decoder_config() -> CodecDecoderConfig:
    return SpeechTokenizerConfig.from_dict(speech_tokenizer_config_dict()).decoder
