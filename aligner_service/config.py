"""The aligner process's settings (:class:`AlignerConfig`) and command line: the model-stage flags
(``--model`` is the aligner checkpoint, ``--device``, ``--dtype``), the batching flags and the
server flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from tts_common import metrics
from tts_common.flags import NOT_A_FLAG, config_from_args, flag, non_negative_float, positive_int
from tts_common.stage_main import StageModelConfig, stage_flags

STAGE = metrics.STAGE_ALIGNER
"""The stage's name (flags' environment prefix, metrics label, logs)."""
DEFAULT_PORT = 50055


@dataclass
class AlignerConfig:
    """Settings of the aligner stage."""

    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    """Torch device (the model stage's ``--device``)."""
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)
    """Torch dtype name (the model stage's ``--dtype``)."""
    max_batch_size: int = field(default=8, metadata=flag(parse=positive_int))
    """Utterances aligned in one forward pass; concurrent Align calls are collected up to this."""
    batch_wait_ms: float = field(default=5.0, metadata=flag(parse=non_negative_float))
    """How long the first waiting utterance waits for others to share its forward pass (ms)."""
    max_audio_seconds: float = field(default=0.0, metadata=flag(parse=non_negative_float))
    """Longest audio accepted, in seconds (longer -> INVALID_ARGUMENT); 0: the model's own limit."""
    max_waiting: int = field(default=256, metadata=NOT_A_FLAG)
    """Utterances allowed to wait for a forward pass; more -> RESOURCE_EXHAUSTED."""


FLAGS = stage_flags(
    STAGE,
    DEFAULT_PORT,
    "qwen3-tts aligner stage (an utterance's audio + text -> word timings, Qwen3-ForcedAligner)",
    ("aligner", AlignerConfig),
)


def aligner_config_from_args(model: StageModelConfig, args: argparse.Namespace) -> AlignerConfig:
    """The :class:`AlignerConfig` of a namespace parsed by ``FLAGS`` (device and dtype from the
    model flags)."""
    return config_from_args(AlignerConfig, args, device=model.device, dtype=model.dtype)


__all__ = ["DEFAULT_PORT", "FLAGS", "STAGE", "AlignerConfig", "aligner_config_from_args"]
