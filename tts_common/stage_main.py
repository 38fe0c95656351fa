"""The ``__main__`` of a model stage process (talker, decoder, speaker, aligner), written once, and the
flags every model stage has (:class:`StageModelConfig`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from .flags import config_from_args, flag
from .logging_setup import setup_logging
from .precision import DTYPE_CHOICES, resolve_dtype
from .serving.config import ProcessFlags
from .serving.lifecycle import serve
from .serving.names import service_name

if TYPE_CHECKING:
    from .auto_dtype import StepProbe

STAGE_DEFAULT_HOST = "127.0.0.1"
"""Bind address default of the model stages: only the gateway is meant to be reachable from
outside the host unless a deployment says otherwise (``--host`` / ``QWEN3TTS_<STAGE>_HOST``)."""


def default_device() -> str:
    """``cuda`` when torch sees a CUDA device, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class StageModelConfig:
    """The checkpoint a model stage loads and where it runs (flags of every model stage)."""

    model: str = ""
    """Checkpoint directory in the official layout (required)."""

    device: str = field(default_factory=default_device)
    """Torch device (default cuda when available, else cpu)."""

    dtype: str = field(default="float32", metadata=flag(choices=DTYPE_CHOICES))
    """Weight/activation dtype; auto = bfloat16 where it is faster: on CUDA with bf16 support; on
    CPU where this stage's own step measures faster in bfloat16 than in float32 over 1 and 8 rows
    and slower at neither (at the first start, then cached), else float32 (tts_common/auto_dtype.py). float32 keeps
    parity with the official implementation."""

    threads: int = 0
    """CPU threads for torch (0 = torch's default); set it when several stages share a CPU
    host."""


def stage_flags(
    stage: str, default_port: int, description: str, config: tuple[str, type] | None = None
) -> ProcessFlags:
    """The command line of a model stage: :class:`StageModelConfig` ("model" flags), the
    stage's own ``config`` dataclass (``(group title, class)``), then the server flags; stages
    listen on :data:`STAGE_DEFAULT_HOST` by default."""
    groups = [("model", StageModelConfig), *([config] if config is not None else [])]
    return ProcessFlags(
        stage=stage,
        default_port=default_port,
        groups=tuple(groups),
        default_host=STAGE_DEFAULT_HOST,
        description=description,
    )


class StageServicer(Protocol):
    async def load(self) -> None:
        """Load the model (health turns SERVING once this returns)."""


def resolve_model_config(model: StageModelConfig, cpu_probe: Callable[[], StepProbe]) -> StageModelConfig:
    """``model`` with ``--dtype auto`` replaced by the dtype it means on ``model.device``
    (:func:`tts_common.precision.resolve_dtype`; on CPU ``cpu_probe()`` is the stage's step it
    times), logged; other dtypes unchanged."""
    if model.dtype != "auto":
        return model
    resolved = dataclasses.replace(model, dtype=resolve_dtype(model.dtype, model.device, cpu_probe))
    logging.getLogger(__name__).info("--dtype auto on %s: %s", resolved.device, resolved.dtype)
    return resolved


def run_stage_process(
    *,
    flags: ProcessFlags,
    build_servicer: Callable[[StageModelConfig, argparse.Namespace], StageServicer],
    add_to_server: Callable[[Any, grpc.aio.Server], None],
    pb2_module: ModuleType,
    service: str,
    cpu_dtype_probe: Callable[[StageModelConfig, argparse.Namespace], StepProbe],
    argv: list[str] | None = None,
) -> None:
    """Parse flags, set up logging, serve until SIGTERM/SIGINT (then drain and exit 0).

    ``--model`` (or ``QWEN3TTS_MODEL``) is required; ``build_servicer(model_config, args)``
    builds the servicer (its stage config from ``args``), whose ``load()`` runs while health says
    NOT_SERVING and whose optional ``close()`` runs after the server stopped.
    ``cpu_dtype_probe(model_config, args)``: the stage's step, timed for ``--dtype auto`` on CPU
    (on the thread count ``--threads`` sets).
    """
    parser = flags.parser()
    args = parser.parse_args(argv)
    config = flags.server_config(args)
    model = config_from_args(StageModelConfig, args)
    if not model.model:
        parser.error("--model (or QWEN3TTS_MODEL) is required")
    setup_logging(config.log_level, stage=flags.stage)
    if model.threads > 0:  # before --dtype auto: it is timed on these threads
        import torch

        torch.set_num_threads(model.threads)
    model = resolve_model_config(model, functools.partial(cpu_dtype_probe, model, args))
    servicer = build_servicer(model, args)

    async def run() -> None:
        await serve(
            config,
            lambda server: add_to_server(servicer, server),
            [service_name(pb2_module, service)],
            startup=servicer.load,
            shutdown=getattr(servicer, "close", None),
        )

    asyncio.run(run())
