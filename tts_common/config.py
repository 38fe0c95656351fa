"""Typed views of the official Qwen3-TTS checkpoint configuration files.

Every model-specific id, size and default is read from the checkpoint directory. The defaults of
the dataclasses below are those of the official configuration classes (ARCHITECTURE.md §2), used
only when a field is absent from the file.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tts_common.synthesis.sampling import (
    BUILTIN_MAX_NEW_TOKENS,
    BUILTIN_SAMPLING,
    SamplingParams,
    sampling_from_generation_config,
)

_T = TypeVar("_T")


def _from_dict(cls: type[_T], data: dict[str, Any], **overrides: Any) -> _T:
    """Build dataclass ``cls`` from the known keys of ``data``; unknown keys are ignored."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {k: v for k, v in data.items() if k in names}
    kwargs.update(overrides)
    return cls(**kwargs)


@dataclass
class CodePredictorConfig:
    """The 15-step code predictor (``talker_config.code_predictor_config``)."""

    vocab_size: int = 2048
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    num_code_groups: int = 32

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads


@dataclass
class TalkerConfig:
    """The talker LM (``talker_config``)."""

    text_vocab_size: int
    """Rows of ``talker.model.text_embedding`` (no class default: required)."""
    vocab_size: int = 3072
    """Codec vocabulary of the talker: 2048 codes plus control, language and speaker ids."""
    hidden_size: int = 1024
    intermediate_size: int = 2048
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False
    num_code_groups: int = 32
    text_hidden_size: int = 2048
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: dict[str, int] = field(default_factory=dict)
    """Preset speaker name (lower case) -> codec id whose embedding is the speaker vector."""
    spk_is_dialect: dict[str, str | bool] = field(default_factory=dict)
    """Preset speaker name -> dialect language name, or false."""
    codec_language_id: dict[str, int] = field(default_factory=dict)
    """Language name (lower case) -> codec id."""
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.spk_id = dict(self.spk_id or {})
        self.spk_is_dialect = dict(self.spk_is_dialect or {})
        self.codec_language_id = dict(self.codec_language_id or {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TalkerConfig:
        cp = _from_dict(CodePredictorConfig, data.get("code_predictor_config") or {})
        return _from_dict(cls, data, code_predictor=cp)


@dataclass
class SpeakerEncoderConfig:
    """ECAPA-TDNN speaker encoder (``speaker_encoder_config``; Base checkpoints only)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list[int] = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000


@dataclass
class CodecDecoderConfig:
    """The 12 Hz speech-tokenizer decoder (``speech_tokenizer/config.json: decoder_config``)."""

    codebook_dim: int
    """Full codebook dimension; each split-RVQ entry has ``codebook_dim // 2`` values (required)."""
    codebook_size: int = 2048
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 4, 3])
    upsampling_ratios: list[int] = field(default_factory=lambda: [2, 2])
    decoder_dim: int = 1536

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.upsample_rates = list(self.upsample_rates)
        self.upsampling_ratios = list(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per codec frame (1920 for the released decoder)."""
        total = 1
        for r in [*self.upsampling_ratios, *self.upsample_rates]:
            total *= r
        return total


@dataclass
class SpeechTokenizerConfig:
    """``speech_tokenizer/config.json`` (model_type ``qwen3_tts_tokenizer_12hz``)."""

    decoder: CodecDecoderConfig
    encoder_config: dict[str, Any] = field(default_factory=dict)
    """Raw ``transformers.MimiConfig`` fields of the encoder half."""
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeechTokenizerConfig:
        decoder = _from_dict(CodecDecoderConfig, data.get("decoder_config") or {})
        return _from_dict(cls, data, decoder=decoder)


@dataclass
class Qwen3TTSConfig:
    """Top-level ``config.json`` (model_type ``qwen3_tts``)."""

    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None = None
    """Present (and its weights loaded) only for ``tts_model_type == "base"``."""
    tokenizer_type: str | None = None
    tts_model_size: str | None = None
    """``"0b6"`` or ``"1b7"``; 0.6B CustomVoice ignores instruct in the official code."""
    tts_model_type: str | None = None
    """``"base"`` (voice clone), ``"custom_voice"`` (preset speakers) or ``"voice_design"``."""
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Qwen3TTSConfig:
        talker = TalkerConfig.from_dict(data.get("talker_config") or {})
        speaker = None
        if data.get("tts_model_type") == "base":
            speaker = _from_dict(SpeakerEncoderConfig, data.get("speaker_encoder_config") or {})
        return _from_dict(cls, data, talker=talker, speaker_encoder=speaker)

    @property
    def instruct_supported(self) -> bool:
        """Whether the official implementation honours ``instruct`` for this checkpoint."""
        if self.tts_model_type == "voice_design":
            return True
        if self.tts_model_type == "custom_voice":
            # The official wrapper tests `tts_model_size in "0b6"` (a substring test).
            return not (self.tts_model_size is not None and self.tts_model_size in "0b6")
        return False


@dataclass(frozen=True)
class GenerationConfig:
    """``generation_config.json``: the checkpoint's sampling defaults over the built-in ones
    (``tts_common.synthesis.sampling`` holds the table and the one translation of its keys)."""

    sampling: SamplingParams = BUILTIN_SAMPLING
    max_new_tokens: int = BUILTIN_MAX_NEW_TOKENS
    """The checkpoint's step budget (offline synthesis default; the server uses a runaway guard)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationConfig:
        sampling, max_new_tokens = sampling_from_generation_config(data)
        return cls(sampling=sampling, max_new_tokens=max_new_tokens)


@dataclass
class CheckpointConfig:
    """Everything configurable read from one released (or dev) checkpoint directory."""

    path: Path
    model: Qwen3TTSConfig
    speech_tokenizer: SpeechTokenizerConfig
    generation: GenerationConfig

    @property
    def weights_path(self) -> Path:
        return self.path / "model.safetensors"

    @property
    def speech_tokenizer_weights_path(self) -> Path:
        return self.path / "speech_tokenizer" / "model.safetensors"


class CheckpointError(ValueError):
    """The directory is not a loadable Qwen3-TTS checkpoint."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError as exc:
        raise CheckpointError(f"missing checkpoint file: {path}") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"invalid JSON in {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def load_checkpoint_config(path: str | Path) -> CheckpointConfig:
    """Read ``config.json``, ``generation_config.json`` and ``speech_tokenizer/config.json``."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    raw = _read_json(root / "config.json")
    if raw.get("model_type") not in (None, "qwen3_tts"):
        raise CheckpointError(f"{root}/config.json: model_type {raw.get('model_type')!r} is not qwen3_tts")
    model = Qwen3TTSConfig.from_dict(raw)
    st = SpeechTokenizerConfig.from_dict(_read_json(root / "speech_tokenizer" / "config.json"))
    gen_path = root / "generation_config.json"
    gen = GenerationConfig.from_dict(_read_json(gen_path)) if gen_path.exists() else GenerationConfig()
    return CheckpointConfig(path=root, model=model, speech_tokenizer=st, generation=gen)
