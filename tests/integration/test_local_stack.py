"""``qwen3-tts up``: a Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops
every process and exits 0; a stage that dies on its own makes it exit 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.fixtures import CKPT_DIR
from tests.helpers.stack import free_port


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_up(sigint_ignored: bool = False) -> tuple[subprocess.Popen[str], int]:
    base = free_port()
    cmd = [
        sys.executable, "-m", "qwen3_tts.cli", "up", "--model", str(CKPT_DIR / "tiny_voice_design"),
        "--port", str(free_port()), "--base-port", str(base),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    for line in proc.stdout:
        if "stack is up" in line:
            return proc, base
        assert time.monotonic() < deadline, "the stack did not come up"
    raise AssertionError(f"qwen3-tts up exited with {proc.wait()} before it was up")


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["terminal", "launched-with-sigint-ignored"])
def test_ctrl_c_stops_everything_and_exits_0(sigint_ignored: bool) -> None:
    """Also when the launcher handed SIGINT down ignored (scripts, ``cmd &``): the stages handle
    it and stop, and that is the user's stop, not a stage failure."""
    proc, _ = _start_up(sigint_ignored)
    pgid = os.getpgid(proc.pid)
    assert len(_children(proc.pid)) == 4
    os.killpg(pgid, signal.SIGINT)
    assert proc.wait(60) == 0
    assert _group_gone(pgid, 30), "a stage outlived qwen3-tts up"


def test_a_stage_dying_on_its_own_exits_1() -> None:
    proc, _ = _start_up()
    pgid = os.getpgid(proc.pid)
    os.kill(_children(proc.pid)[0], signal.SIGKILL)  # the talker
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "talker exited with code -9; stopping" in output
    assert _group_gone(pgid, 30)
