"""The speaker process's settings (:class:`SpeakerConfig`) and command line: the model-stage
flags, ``--cache-size --max-audio-seconds`` and the server flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from tts_common.flags import NOT_A_FLAG, config_from_args
from tts_common.stage_main import StageModelConfig, stage_flags

STAGE = "speaker"
DEFAULT_PORT = 50054


@dataclass
class SpeakerConfig:
    """Settings of the speaker stage."""

    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    """Torch device (the model stage's ``--device``)."""
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)
    """Torch dtype name (the model stage's ``--dtype``)."""
    cache_size: int = 256
    """Reference embeddings kept (LRU)."""
    max_audio_seconds: float = 60.0
    """Longest reference accepted (longer -> INVALID_ARGUMENT)."""
    max_concurrent: int = field(default=4, metadata=NOT_A_FLAG)
    """References handed to the compute thread at once (it runs them one after another); more
    callers wait (bounded by max_waiting)."""
    max_waiting: int = field(default=64, metadata=NOT_A_FLAG)
    """Callers allowed to wait for a compute slot; more -> RESOURCE_EXHAUSTED."""


FLAGS = stage_flags(
    STAGE,
    DEFAULT_PORT,
    "qwen3-tts speaker stage (reference audio -> x-vector + reference codes)",
    ("speaker", SpeakerConfig),
)


def speaker_config_from_args(model: StageModelConfig, args: argparse.Namespace) -> SpeakerConfig:
    """The :class:`SpeakerConfig` of a namespace parsed by ``FLAGS`` (device and dtype from the
    model flags)."""
    return config_from_args(SpeakerConfig, args, device=model.device, dtype=model.dtype)


__all__ = ["DEFAULT_PORT", "FLAGS", "STAGE", "SpeakerConfig", "speaker_config_from_args"]
