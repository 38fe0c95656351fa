"""The talker process's command line: the model-stage flags, the :class:`EngineConfig` flags
(``--max-slots --max-seq-len --max-waiting --cuda-graphs``) and the server flags."""

from __future__ import annotations

import argparse

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


def engine_config_from_args(model: StageModelConfig, args: argparse.Namespace) -> EngineConfig:
    """The engine settings of a namespace parsed by ``FLAGS``: its flags and the model's device
    and dtype."""
    return config_from_args(EngineConfig, args, device=model.device, dtype=model.dtype)


__all__ = ["DEFAULT_PORT", "FLAGS", "STAGE", "engine_config_from_args"]
