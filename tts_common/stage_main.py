"""The ``__main__`` of a model stage process (talker, decoder, speaker), written once."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import grpc

from .logging_setup import setup_logging
from .serving import parse_server_args, serve, service_name

STAGE_DEFAULT_HOST = "127.0.0.1"


class StageServicer(Protocol):
    async def load(self) -> None:
        """Load the model (health turns SERVING once this returns)."""


def run_stage_process(
    *,
    stage: str,
    description: str,
    default_port: int,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    build_servicer: Callable[[argparse.Namespace], StageServicer],
    add_to_server: Callable[[Any, grpc.aio.Server], None],
    pb2_module: ModuleType,
    service: str,
    argv: list[str] | None = None,
) -> None:
    """Parse flags, set up logging, serve until SIGTERM/SIGINT (then drain and exit 0).

    ``--model`` (or ``QWEN3TTS_MODEL``) is required; the servicer's ``load()`` runs while health
    says NOT_SERVING and its optional ``close()`` after the server stopped.
    """
    parser = argparse.ArgumentParser(description=description)
    add_arguments(parser)
    # Stages listen on loopback unless told otherwise (--host / QWEN3TTS_<STAGE>_HOST): only the
    # gateway is meant to be reachable from outside the host.
    config, args = parse_server_args(
        argv, stage=stage, default_port=default_port, parser=parser, default_host=STAGE_DEFAULT_HOST
    )
    if not getattr(args, "model", ""):
        parser.error("--model (or QWEN3TTS_MODEL) is required")
    setup_logging(config.log_level, stage=stage)
    if getattr(args, "threads", 0) > 0:
        import torch

        torch.set_num_threads(args.threads)
    servicer = build_servicer(args)

    async def run() -> None:
        await serve(
            config,
            lambda server: add_to_server(servicer, server),
            [service_name(pb2_module, service)],
            startup=servicer.load,
            shutdown=getattr(servicer, "close", None),
        )

    asyncio.run(run())


def add_model_arguments(parser: argparse.ArgumentParser, stage: str) -> None:
    """``--model``, ``--device``, ``--dtype`` of a model stage (env ``QWEN3TTS_[<STAGE>_]MODEL`` ...)."""
    import torch

    parser.add_argument(
        "--model",
        default=env_default(stage, "MODEL", ""),
        help="checkpoint directory in the official layout (env QWEN3TTS_MODEL)",
    )
    parser.add_argument(
        "--device",
        default=env_default(stage, "DEVICE", "cuda" if torch.cuda.is_available() else "cpu"),
        help="torch device (env QWEN3TTS_DEVICE)",
    )
    parser.add_argument(
        "--dtype",
        default=env_default(stage, "DTYPE", "float32"),
        choices=["float32", "bfloat16"],
        help="activation/weight dtype (env QWEN3TTS_DTYPE)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(env_default(stage, "THREADS", "0")),
        help="CPU threads for torch (0 = torch's default); set it when several stages "
        "share a CPU host (env QWEN3TTS_THREADS)",
    )


def env_default(stage: str, name: str, default: str) -> str:
    """``QWEN3TTS_<STAGE>_<NAME>``, else ``QWEN3TTS_<NAME>``, else ``default``."""
    import os

    return os.environ.get(f"QWEN3TTS_{stage.upper()}_{name}", os.environ.get(f"QWEN3TTS_{name}", default))
