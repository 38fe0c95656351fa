"""Typed view of a Qwen3-ForcedAligner ``config.json`` (ARCHITECTURE.md §12).

The released file has ``model_type`` ``qwen3_asr`` with a ``thinker_config`` whose ``model_type``
is ``qwen3_forced_aligner``: that value (the substring ``forced_aligner``) is what makes the
official ``lm_head`` a ``Linear(hidden, classify_num)`` timestamp classifier instead of a
vocabulary head, so a checkpoint without it is a speech recogniser, not an aligner, and is refused.
Defaults below are the official classes' defaults, used only where the file leaves a field out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class AlignerCheckpointError(ValueError):
    """The folder is not a loadable Qwen3-ForcedAligner checkpoint (files missing, wrong kind,
    inconsistent fields)."""


def _get(d: dict[str, Any], key: str, default: Any, where: str) -> Any:
    value = d.get(key, default)
    if value is None:
        raise AlignerCheckpointError(f"config.json: {where}.{key} is required")
    return value


@dataclass(frozen=True)
class AudioEncoderConfig:
    """``thinker_config.audio_config``: the Whisper-style audio tower."""

    num_mel_bins: int
    """Mel bands of the input features (128)."""
    d_model: int
    """Transformer width (1024 in the release)."""
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    activation_function: str
    """Activation of the feed-forward blocks and between ``proj1`` and ``proj2`` (``gelu``)."""
    downsample_hidden_size: int
    """Channels of the three stride-2 Conv2d layers (480)."""
    output_dim: int
    """Width of the audio embeddings handed to the text model (= its hidden size)."""
    n_window: int
    """Half the mel frames of one convolution chunk: chunks of ``2 * n_window`` (100) frames."""
    n_window_infer: int
    """Mel frames of one attention window of the flash-attention path (800); the official default
    (SDPA / eager) path attends over the whole utterance, see :mod:`.audio_encoder`."""
    max_source_positions: int
    """Rows of the sinusoidal position table (positions restart in every chunk)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AudioEncoderConfig:
        """Read ``thinker_config.audio_config`` (official defaults for absent fields);
        :class:`AlignerCheckpointError` for a layout the audio tower does not implement."""
        where = "thinker_config.audio_config"
        if d.get("scale_embedding", False):
            raise AlignerCheckpointError(f"config.json: {where}.scale_embedding true is not supported")
        return cls(
            num_mel_bins=int(_get(d, "num_mel_bins", 128, where)),
            d_model=int(_get(d, "d_model", 1280, where)),
            encoder_layers=int(_get(d, "encoder_layers", 32, where)),
            encoder_attention_heads=int(_get(d, "encoder_attention_heads", 20, where)),
            encoder_ffn_dim=int(_get(d, "encoder_ffn_dim", 5120, where)),
            activation_function=str(_get(d, "activation_function", "gelu", where)),
            downsample_hidden_size=int(_get(d, "downsample_hidden_size", 480, where)),
            output_dim=int(_get(d, "output_dim", 3584, where)),
            n_window=int(_get(d, "n_window", 100, where)),
            n_window_infer=int(_get(d, "n_window_infer", 400, where)),
            max_source_positions=int(_get(d, "max_source_positions", 1500, where)),
        )


@dataclass(frozen=True)
class TextConfig:
    """``thinker_config.text_config``: the Qwen3 text model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TextConfig:
        """Read ``thinker_config.text_config`` (official defaults for absent fields);
        :class:`AlignerCheckpointError` for a RoPE layout other than plain RoPE."""
        where = "thinker_config.text_config"
        heads = int(_get(d, "num_attention_heads", 32, where))
        hidden = int(_get(d, "hidden_size", 4096, where))
        kv = d.get("num_key_value_heads") or heads
        rope_scaling = d.get("rope_scaling") or {}
        sections = rope_scaling.get("mrope_section")
        head_dim = int(d.get("head_dim") or hidden // heads)
        # Multimodal RoPE with the same position on its three axes (always so for the aligner:
        # the official get_rope_index repeats one position stream) is plain RoPE, whatever the
        # sections; a section layout that does not cover head_dim / 2 would not be.
        if sections is not None and sum(int(s) for s in sections) != head_dim // 2:
            raise AlignerCheckpointError(
                f"config.json: {where}.rope_scaling.mrope_section {sections} does not sum to head_dim/2"
            )
        if rope_scaling.get("rope_type", "default") != "default":
            raise AlignerCheckpointError(
                f"config.json: {where}.rope_scaling.rope_type {rope_scaling.get('rope_type')!r} "
                "is not supported (only 'default')"
            )
        return cls(
            vocab_size=int(_get(d, "vocab_size", 151936, where)),
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", 22016, where)),
            num_hidden_layers=int(_get(d, "num_hidden_layers", 32, where)),
            num_attention_heads=heads,
            num_key_value_heads=int(kv),
            head_dim=head_dim,
            hidden_act=str(_get(d, "hidden_act", "silu", where)),
            rms_norm_eps=float(_get(d, "rms_norm_eps", 1e-6, where)),
            rope_theta=float(_get(d, "rope_theta", 5000000.0, where)),
            attention_bias=bool(d.get("attention_bias", False)),
        )


@dataclass(frozen=True)
class ForcedAlignerConfig:
    """The fields of a checkpoint's ``config.json`` the aligner model uses (the stage's own
    settings are :class:`aligner_service.config.AlignerConfig`)."""

    audio: AudioEncoderConfig
    text: TextConfig
    classify_num: int
    """Timestamp classes (5000 in the release): class ``c`` means ``c * timestamp_segment_time`` ms."""
    audio_token_id: int
    """The ``<|audio_pad|>`` placeholder replaced by the audio embeddings."""
    timestamp_token_id: int
    """``<timestamp>``: the positions whose classes are the word starts and ends."""
    timestamp_segment_time: float
    """Milliseconds per timestamp class (80)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForcedAlignerConfig:
        """Read a whole ``config.json`` dict; :class:`AlignerCheckpointError` for a checkpoint
        that is not a forced aligner or whose fields do not fit together."""
        thinker = d.get("thinker_config")
        if not isinstance(thinker, dict):
            raise AlignerCheckpointError("config.json: thinker_config is missing: not a Qwen3-ASR checkpoint")
        kind = str(thinker.get("model_type", ""))
        if "forced_aligner" not in kind:
            raise AlignerCheckpointError(
                f"config.json: thinker_config.model_type is {kind!r}, not 'qwen3_forced_aligner': "
                "a Qwen3-ASR recogniser, not a forced aligner"
            )
        audio = AudioEncoderConfig.from_dict(thinker.get("audio_config") or {})
        text = TextConfig.from_dict(thinker.get("text_config") or {})
        if audio.output_dim != text.hidden_size:
            raise AlignerCheckpointError(
                f"config.json: audio output_dim {audio.output_dim} != text hidden_size {text.hidden_size}"
            )
        if audio.d_model % audio.encoder_attention_heads:
            raise AlignerCheckpointError("config.json: audio d_model is not a multiple of its heads")
        cfg = cls(
            audio=audio,
            text=text,
            classify_num=int(_get(thinker, "classify_num", None, "thinker_config")),
            audio_token_id=int(_get(thinker, "audio_token_id", 151646, "thinker_config")),
            timestamp_token_id=int(_get(d, "timestamp_token_id", None, "config")),
            timestamp_segment_time=float(_get(d, "timestamp_segment_time", None, "config")),
        )
        if cfg.timestamp_segment_time <= 0:
            raise AlignerCheckpointError("config.json: timestamp_segment_time must be positive")
        for name in ("audio_token_id", "timestamp_token_id"):
            if not 0 <= getattr(cfg, name) < text.vocab_size:
                raise AlignerCheckpointError(f"config.json: {name} is outside the text vocabulary")
        return cfg

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> ForcedAlignerConfig:
        """Read ``path/config.json``."""
        file = Path(path) / "config.json"
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise AlignerCheckpointError(f"no config.json in {path}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AlignerCheckpointError(f"{file}: unreadable: {exc}") from exc
        if not isinstance(data, dict):
            raise AlignerCheckpointError(f"{file}: not a JSON object")
        return cls.from_dict(data)
