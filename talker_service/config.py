"""The talker process's command line: the model-stage flags, the :class:`EngineConfig` flags
(``--max-slots --max-seq-len --max-waiting --no-cuda-graphs``) and the server flags."""

from __future__ import annotations

import argparse
import dataclasses

from tts_common.flags import config_from_args
from tts_common.stage_main import StageModelConfig, stage_flags

from .engine.config import EngineConfig

STAGE = "talker"
DEFAULT_PORT = 50052

FLAGS = stage_flags(
    STAGE,
    DEFAULT_PORT,
    "qwen3-tts talker stage (talker LM + code predictor, continuous batching)",
    ("engine", EngineConfig),
)


def batch_buckets_for(max_slots: int) -> tuple[int, ...]:
    """Powers of two up to ``max_slots``, plus ``max_slots``: one CUDA graph each."""
    buckets = {max_slots}
    b = 1
    while b < max_slots:
        buckets.add(b)
        b *= 2
    return tuple(sorted(buckets))


def engine_config_from_args(model: StageModelConfig, args: argparse.Namespace) -> EngineConfig:
    """The engine settings of a namespace parsed by ``FLAGS``: its flags, the model's device and
    dtype, and one batch bucket per power of two up to ``max_slots``."""
    config = config_from_args(EngineConfig, args, device=model.device, dtype=model.dtype)
    return dataclasses.replace(config, batch_buckets=batch_buckets_for(config.max_slots))


__all__ = ["DEFAULT_PORT", "FLAGS", "STAGE", "batch_buckets_for", "engine_config_from_args"]
