"""``qwen3-tts up``: the HTTP API it prints answers (playground page, the printed curl request
gives a WAV); a Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops
every process and exits 0; a stage that dies on its own makes it exit 1."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import soundfile as sf

from tests.helpers.fixtures import CKPT_DIR
from tests.helpers.stack import free_port


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_up(sigint_ignored: bool = False) -> tuple[subprocess.Popen[str], list[str]]:
    """``qwen3-tts up`` on free ports, once it is up; with the lines it printed then."""
    base = free_port()
    cmd = [
        sys.executable, "-m", "qwen3_tts.cli", "up", "--model", str(CKPT_DIR / "tiny_voice_design"),
        "--port", str(free_port()), "--base-port", str(base), "--http-port", str(free_port()),
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
    printed: list[str] = []
    for line in proc.stdout:
        if "stack is up" in line or printed:
            printed.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops it."):
                return proc, printed
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
    proc, printed = _start_up(sigint_ignored)
    pgid = os.getpgid(proc.pid)
    assert len(_children(proc.pid)) == 4
    if not sigint_ignored:
        _check_printed_http_api(printed)
    os.killpg(pgid, signal.SIGINT)
    assert proc.wait(60) == 0
    assert _group_gone(pgid, 30), "a stage outlived qwen3-tts up"


def _check_printed_http_api(printed: list[str]) -> None:
    """The playground URL ``up`` prints serves the page, and its curl example gives a WAV."""
    (page,) = [m.group(1) for line in printed if (m := re.search(r"playground: (http://\S+)", line))]
    with urllib.request.urlopen(page, timeout=10) as reply:
        assert reply.status == 200 and b'id="speak"' in reply.read()
    (curl,) = [line for line in printed if line.strip().startswith("curl ")]
    url = re.search(r"curl (http://\S+)", curl).group(1)  # type: ignore[union-attr]
    body = json.loads(re.search(r"-d '(.*?)'", curl).group(1))  # type: ignore[union-attr]
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        audio, rate = sf.read(io.BytesIO(reply.read()))
    assert rate == 24000 and audio.size > 0


def test_a_stage_dying_on_its_own_exits_1() -> None:
    proc, _ = _start_up()
    pgid = os.getpgid(proc.pid)
    os.kill(_children(proc.pid)[0], signal.SIGKILL)  # the talker
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "talker exited with code -9; stopping" in output
    assert _group_gone(pgid, 30)
