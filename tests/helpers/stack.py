"""Start the real four-process stack on loopback for integration tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_tts.local_stack import StageProcess, stage_commands, stop_all, wait_until_serving


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningStack:
    stages: list[StageProcess]
    log_dir: Path
    by_name: dict[str, StageProcess] = field(default_factory=dict)
    http_port: int = 0
    """The gateway's HTTP API port."""

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def address(self, name: str) -> str:
        return self.by_name[name].address

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))


def start_stage(stage: StageProcess, log_dir: Path, extra_env: dict[str, str] | None = None) -> None:
    env = os.environ.copy()
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env or {})
    log = open(log_dir / f"{stage.name}.log", "ab")
    stage.process = subprocess.Popen(stage.args, stdout=log, stderr=subprocess.STDOUT, env=env)


@contextmanager
def running_stack(
    model: Path, log_dir: Path, gateway_args: list[str] | None = None, extra_env: dict[str, str] | None = None
):
    """The four processes (ports chosen free, the gateway's HTTP API's too), SERVING; stopped
    (SIGTERM) on exit."""
    ports = [free_port() for _ in range(5)]
    stages = stage_commands(model, "127.0.0.1", ports[0], ports[1], None, False, http_port=ports[4])
    # stage_commands numbers stage ports consecutively from base_port: re-point them at free ports.
    for stage, port in zip(stages[:3], ports[1:]):
        stage.port = port
        stage.args[stage.args.index("--port") + 1] = str(port)
    gateway = stages[3]
    for flag, port in zip(["--talker-targets", "--decoder-targets", "--speaker-targets"], ports[1:]):
        gateway.args[gateway.args.index(flag) + 1] = f"127.0.0.1:{port}"
    gateway.args += gateway_args or []
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = RunningStack(stages, log_dir, {s.name: s for s in stages}, http_port=ports[4])
    try:
        for stage in stages:
            start_stage(stage, log_dir, extra_env)
        try:
            wait_until_serving(stages, timeout=180)
        except Exception as exc:
            raise RuntimeError(f"stack did not start: {exc}\n{stack.logs()}") from exc
        yield stack
    finally:
        stop_all(stages, grace=20)


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


PYTHON = sys.executable
