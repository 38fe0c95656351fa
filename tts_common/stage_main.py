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


def env_default(stage: str, name: str, default: str) -> str:
    """``QWEN3TTS_<STAGE>_<NAME>``, else ``QWEN3TTS_<NAME>``, else ``default``."""
    import os

    return os.environ.get(f"QWEN3TTS_{stage.upper()}_{name}", os.environ.get(f"QWEN3TTS_{name}", default))
