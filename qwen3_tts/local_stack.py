"""``qwen3-tts up``: the four stage processes on this machine, on loopback, until interrupted."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SHARED_HOST_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Environment defaults of every child: the model stages share this host's cores, each with all of
them (torch's default thread count), so that a lone stream's talker or decoder work uses the whole
machine. OpenMP workers then wait passively (sleep at once instead of spinning for a while after
each parallel region), so a stage that is between kernels leaves its cores to the stages that are
working instead of spinning on them. Variables already set in the environment win (compare
``OMP_WAIT_POLICY=ACTIVE qwen3-tts up``). See deploy/OPERATIONS.md, "CPU hosts"."""


def stage_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the stack's children: ``base`` plus :data:`SHARED_HOST_ENV` where
    ``base`` leaves those variables unset."""
    env = dict(base)
    for key, value in SHARED_HOST_ENV.items():
        if not env.get(key):
            env[key] = value
    return env


@dataclass
class StageProcess:
    """One child process of the local stack."""

    name: str
    port: int
    args: list[str]
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def stage_commands(
    model: Path, host: str, port: int, base_port: int, device: str | None, metrics: bool
) -> list[StageProcess]:
    """Command lines of the stages and the gateway (the same flags the deploy files use)."""
    py = [sys.executable, "-m"]
    talker, decoder, speaker = base_port, base_port + 1, base_port + 2
    # No --threads: each stage gets all cores, sharing them through passive OpenMP waiting
    # (SHARED_HOST_ENV).
    dev = ["--device", device] if device else []

    def metrics_flag(offset: int) -> list[str]:
        return ["--metrics-port", str(9091 + offset)] if metrics else []

    return [
        StageProcess(
            "talker",
            talker,
            py
            + [
                "talker_service",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(talker),
                *dev,
                *metrics_flag(1),
            ],
        ),
        StageProcess(
            "decoder",
            decoder,
            py
            + [
                "decoder_service",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(decoder),
                *dev,
                *metrics_flag(2),
            ],
        ),
        StageProcess(
            "speaker",
            speaker,
            py
            + [
                "speaker_service",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(speaker),
                *dev,
                *metrics_flag(3),
            ],
        ),
        StageProcess(
            "gateway",
            port,
            py
            + [
                "gateway",
                "--host",
                host,
                "--port",
                str(port),
                "--talker-targets",
                f"127.0.0.1:{talker}",
                "--decoder-targets",
                f"127.0.0.1:{decoder}",
                "--speaker-targets",
                f"127.0.0.1:{speaker}",
                *metrics_flag(0),
            ],
        ),
    ]


def is_serving(address: str, timeout: float = 1.0) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def wait_until_serving(stages: list[StageProcess], timeout: float, stop: StopRequest | None = None) -> None:
    """Block until every stage reports SERVING (or ``stop`` is requested); raise if one exits or
    the timeout passes."""
    deadline = time.monotonic() + timeout
    pending = list(stages)
    while pending and not (stop and stop.requested):
        for stage in list(pending):
            assert stage.process is not None
            if stage.process.poll() is not None:
                if stop is not None and stop.settle():
                    return
                raise RuntimeError(
                    f"{stage.name} exited with code {stage.process.returncode} during start-up"
                )
            if is_serving(stage.address):
                pending.remove(stage)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not serving after {timeout:.0f} s: {', '.join(s.name for s in pending)}")
        time.sleep(0.2)


class StopRequest:
    """SIGINT / SIGTERM of the stack's parent: a stop the user asked for (exit 0, not an error).

    A Ctrl-C in a terminal reaches every process of the foreground group, the children included:
    they begin their own graceful shutdown at the same moment, so a child exiting is expected
    then, and the parent gives them a moment before it sends its own SIGTERM (a second signal
    would make them cancel in-flight calls instead of draining).
    """

    SETTLE_SECONDS = 1.0

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signal = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def settle(self) -> bool:
        """After a child exited: whether that was part of a requested stop (waits briefly for
        the parent's signal, which can arrive just after the child's)."""
        deadline = time.monotonic() + self.SETTLE_SECONDS
        while not self.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.requested


def stop_all(stages: list[StageProcess], grace: float = 30.0, already_signalled: bool = False) -> None:
    """SIGTERM every child (gateway first so it drains), then wait; SIGKILL stragglers.

    ``already_signalled``: the children got the same signal (a terminal's Ctrl-C): give them a
    moment to exit by themselves before the SIGTERM."""
    if already_signalled:
        deadline = time.monotonic() + StopRequest.SETTLE_SECONDS
        while time.monotonic() < deadline and any(s.process and s.process.poll() is None for s in stages):
            time.sleep(0.05)
    for stage in reversed(stages):
        if stage.process is not None and stage.process.poll() is None:
            stage.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for stage in stages:
        if stage.process is None:
            continue
        try:
            stage.process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stage.process.kill()
            stage.process.wait()


def run_local_stack(args: argparse.Namespace) -> int:
    model = args.model
    if model is None:
        from .dev_model import make_dev_model

        model = args.dev_model_dir / args.dev_model_type
        if not (model / "config.json").is_file():
            print(f"creating the dev checkpoint ({args.dev_model_type}) in {model} ...", flush=True)
        make_dev_model(model, args.dev_model_type, if_missing=True)
    stages = stage_commands(model.resolve(), args.host, args.port, args.base_port, args.device, args.metrics)
    env = stage_environment(os.environ)
    stop = StopRequest()
    try:
        for stage in stages:
            stage.process = subprocess.Popen(stage.args, env=env)
        wait_until_serving(stages, timeout=600, stop=stop)
        if not stop.requested:
            print(
                f"\nqwen3-tts stack is up: gateway {args.host}:{args.port} (model {model})\n"
                f'  qwen3-tts say --gateway 127.0.0.1:{args.port} "Hello world." -o hello.wav\n'
                f"  grpcurl -plaintext 127.0.0.1:{args.port} list\n"
                "Ctrl-C stops it.",
                flush=True,
            )
        while not stop.requested:
            for stage in stages:
                assert stage.process is not None
                if stage.process.poll() is not None and not stop.settle():
                    print(
                        f"{stage.name} exited with code {stage.process.returncode}; stopping", file=sys.stderr
                    )
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        stop_all(stages, already_signalled=stop.signal is signal.SIGINT)
