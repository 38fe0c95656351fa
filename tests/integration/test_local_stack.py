"""``qwen3-tts up``: the HTTP API it prints answers (playground page, the printed curl request
gives a WAV); a Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops
every process and exits 0; a stage process that dies is restarted, and only the gateway's death
stops the stack (exit 1); with ``--replicas 2`` a replica killed right after it reports SERVING,
and again right after its restart, comes back each time while the streams in flight keep their
audio; a second ``up`` on the same ports refuses to start, naming the port and ``--base-port``."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf

from qwen3_tts.chaos import TOLERANCE
from qwen3_tts.local_stack import is_serving, stage_commands
from tests.helpers.fixtures import CKPT_DIR
from tests.helpers.stack import free_base_port, free_port, start_up
from tests.helpers.synthesis import responses_audio
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

MODEL = CKPT_DIR / "tiny_voice_design"


@pytest.fixture(scope="module", autouse=True)
def _voices_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The stacks' voice library in a temporary directory (not up's default in the checkout)."""
    global VOICES_DB
    VOICES_DB = str(tmp_path_factory.mktemp("voices") / "voices.db")
    yield


VOICES_DB = ""


def _up_command(base: int, port: int, http_port: int, replicas: int = 1) -> list[str]:
    return [
        sys.executable, "-m", "qwen3_tts.cli", "up", "--model", str(MODEL), "--port", str(port),
        "--base-port", str(base), "--http-port", str(http_port), "--replicas", str(replicas),
        "--voices-db", VOICES_DB, "--no-aligner",
    ]  # fmt: skip


def _start_up(
    sigint_ignored: bool = False, replicas: int = 1, cmd: list[str] | None = None
) -> tuple[subprocess.Popen[str], list[str]]:
    """``qwen3-tts up`` on free ports, once it is up; with the lines it printed then."""
    return start_up(cmd or _up_command(free_base_port(), free_port(), free_port(), replicas), sigint_ignored)


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


def _pid_on(up_pid: int, port: int) -> int | None:
    """The child of ``up`` that listens on ``port`` (by its command line), if running."""
    for pid in _children(up_pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"--port" in args and args[args.index(b"--port") + 1] == str(port).encode():
            return pid
    return None


def _serving_again(up_pid: int, port: int, old_pid: int, timeout: float) -> int:
    """The pid of a new process on ``port`` once it reports SERVING (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _pid_on(up_pid, port)
        if pid not in (None, old_pid) and is_serving(f"127.0.0.1:{port}", timeout=0.5):
            assert pid is not None
            return pid
        time.sleep(0.05)
    raise AssertionError(f"nothing new serves on port {port} within {timeout:.0f} s")


@dataclass
class Output:
    """Everything ``up`` (and its children) printed after the banner, read by a thread (a full
    pipe would block the processes' logging)."""

    lines: list[str] = field(default_factory=list)

    def drain(self, proc: subprocess.Popen[str]) -> threading.Thread:
        assert proc.stdout is not None
        stdout = proc.stdout
        thread = threading.Thread(target=lambda: self.lines.extend(stdout), daemon=True)
        thread.start()
        return thread

    @property
    def text(self) -> str:
        return "".join(self.lines)


def test_a_stage_process_that_dies_is_restarted_and_the_gateway_s_death_stops_the_stack() -> None:
    """One replica per stage: the killed talker comes back (a new process, SERVING, the stack
    serves again); only the gateway's exit stops ``up``, with exit status 1."""
    base, port = free_base_port(), free_port()
    proc, _ = _start_up(cmd=_up_command(base, port, free_port()))
    output = Output()
    reader = output.drain(proc)
    pgid = os.getpgid(proc.pid)
    talker = _pid_on(proc.pid, base)
    assert talker is not None
    os.kill(talker, signal.SIGKILL)
    _serving_again(proc.pid, base, talker, timeout=60)
    assert proc.poll() is None
    gateway = _pid_on(proc.pid, port)
    assert gateway is not None
    os.kill(gateway, signal.SIGKILL)
    assert proc.wait(60) == 1
    reader.join(10)
    assert re.search(r"talker exited with code -9 after serving \d+ s; restarting it in 1 s", output.text)
    assert "talker is serving again (restart 1)" in output.text
    assert "gateway exited with code -9; stopping" in output.text
    assert _group_gone(pgid, 30)


@pytest.fixture(scope="module")
def two_replicas() -> Iterator[tuple[subprocess.Popen[str], dict[str, int], Output]]:
    """``qwen3-tts up --replicas 2`` on free ports: (process, process name -> port, its output).
    Stopped with Ctrl-C at the end, which must still exit 0."""
    base, port, http_port = free_base_port(), free_port(), free_port()
    proc, _ = _start_up(replicas=2, cmd=_up_command(base, port, http_port, replicas=2))
    ports = {
        s.name: s.port for s in stage_commands(MODEL, "127.0.0.1", port, base, None, False, 2, http_port)
    }
    ports["http"] = http_port
    output = Output()
    reader = output.drain(proc)
    yield proc, ports, output
    os.killpg(os.getpgid(proc.pid), signal.SIGINT)
    assert proc.wait(60) == 0, output.text[-3000:]
    reader.join(10)


def _request() -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        text="A replica goes down and comes back while this stream keeps playing.",
        instruct="A calm, clear voice.",
        sampling=tts_pb2.SamplingOptions(seed=7, max_new_tokens=24),
        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
    )


def test_replicas_killed_right_after_serving_come_back_while_streams_keep_their_audio(
    two_replicas: tuple[subprocess.Popen[str], dict[str, int], Output],
) -> None:
    proc, ports, output = two_replicas
    gateway = f"127.0.0.1:{ports['gateway']}"
    with grpc.insecure_channel(gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        reference = responses_audio(stub.Synthesize(_request(), timeout=60))
        assert reference.size > 0
        results: list[tuple[str, float | None]] = []
        done = threading.Event()

        def stream_until_done() -> None:
            while not done.is_set():
                try:
                    audio = responses_audio(stub.Synthesize(_request(), timeout=60))
                except grpc.RpcError as error:
                    results.append((error.code().name, None))
                    continue
                same_shape = audio.shape == reference.shape
                results.append(("OK", float(np.abs(audio - reference).max()) if same_shape else None))

        workers = [threading.Thread(target=stream_until_done) for _ in range(4)]
        for worker in workers:
            worker.start()
        try:
            while len(results) < 4:  # streams are flowing over both replicas
                time.sleep(0.05)
            port = ports["talker-2"]
            first = _pid_on(proc.pid, port)
            assert first is not None
            os.kill(first, signal.SIGKILL)  # it reported SERVING a few seconds ago
            second = _serving_again(proc.pid, port, first, timeout=60)
            os.kill(second, signal.SIGKILL)  # right after its restart reported SERVING
            _serving_again(proc.pid, port, second, timeout=60)
            settled = len(results)
            while len(results) < settled + 4:  # and the streams go on over both again
                time.sleep(0.05)
        finally:
            done.set()
            for worker in workers:
                worker.join(90)
    assert proc.poll() is None, "the stack stopped"
    failed = [r for r in results if r[0] != "OK" or r[1] is None or r[1] > TOLERANCE]
    assert not failed, f"{len(failed)} of {len(results)} streams failed or differ: {failed[:5]}"
    text = output.text
    # (killed within a health-check tick of SERVING, the exit may count as one before SERVING)
    exits = re.findall(r"talker-2 exited with code -9 (after serving|before reporting SERVING)", text)
    assert len(exits) == 2 and exits[0] == "after serving", text[-3000:]
    assert "talker-2 is serving again (restart 2)" in text
    assert "GIVING UP" not in text and "stopping" not in text
    assert re.search(r"failover talker request \S+: resumed after", text), "no stream was moved"


def test_a_second_up_on_the_same_ports_fails_at_once_naming_the_port(
    two_replicas: tuple[subprocess.Popen[str], dict[str, int], Output],
) -> None:
    proc, ports, _ = two_replicas
    started = time.monotonic()
    second = subprocess.run(
        _up_command(ports["talker"], free_port(), free_port()), capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 2
    assert f"port {ports['talker']} (talker) is already in use" in second.stderr
    assert "--base-port" in second.stderr
    assert time.monotonic() - started < 30, "it must fail before starting anything"
    assert proc.poll() is None, "the first stack is untouched"
