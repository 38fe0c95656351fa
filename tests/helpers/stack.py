"""Start the real four-process stack on loopback for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_tts.local_stack import (
    StageProcess,
    free_port,
    on_free_ports,
    port_taken,
    stage_commands,
    start_in,
    stop_all,
    wait_until_serving,
)

__all__ = ["PYTHON", "RunningStack", "free_base_port", "free_port", "running_stack", "start_up", "wait_for"]


def free_base_port(count: int = 8) -> int:
    """A ``qwen3-tts up --base-port`` whose ``count`` consecutive ports are all free on loopback
    now (the stages take consecutive ports from it: a free base alone let a later stage's port be
    one another process held, and ``up`` rightly refused)."""
    for _ in range(200):
        base = free_port()
        if base + count <= 65536 and not any(port_taken("127.0.0.1", base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on loopback")


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


@contextmanager
def running_stack(
    model: Path,
    log_dir: Path,
    gateway_args: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    replicas: int = 1,
):
    """The processes (``replicas`` talkers and decoders; ports chosen free, the gateway's HTTP
    API's too), SERVING; stopped (SIGTERM) on exit."""
    stages = stage_commands(model, "127.0.0.1", 0, 0, None, False, replicas)
    on_free_ports(stages)
    gateway = stages[-1]
    http_port = int(gateway.args[gateway.args.index("--http-port") + 1])
    gateway.args += gateway_args or []
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = RunningStack(stages, log_dir, {s.name: s for s in stages}, http_port=http_port)
    try:
        for stage in stages:
            start_in(stage, log_dir, extra_env)
        try:
            wait_until_serving(stages, timeout=180)
        except Exception as exc:
            raise RuntimeError(f"stack did not start: {exc}\n{stack.logs()}") from exc
        yield stack
    finally:
        stop_all(stages, grace=20)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_up(
    cmd: list[str], sigint_ignored: bool = False, timeout: float = 180
) -> tuple[subprocess.Popen[str], list[str]]:
    """``cmd`` (a ``qwen3-tts up`` command line) started in its own process group, once it
    printed that the stack is up: the process and the lines of that message. One torch thread
    per process unless the environment says otherwise (several processes on a small machine)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
        env=env,
    )
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    printed: list[str] = []
    before: list[str] = []
    for line in proc.stdout:
        if "stack is up" in line or printed:
            printed.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops it."):
                return proc, printed
        else:
            before = [*before[-40:], line]
        assert time.monotonic() < deadline, "the stack did not come up:\n" + "".join(before)
    raise AssertionError(f"qwen3-tts up exited with {proc.wait()} before it was up:\n" + "".join(before))


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


PYTHON = sys.executable
