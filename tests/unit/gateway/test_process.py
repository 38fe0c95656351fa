"""``python -m gateway`` as a process: NOT_SERVING until the talker answers, then SERVING with
the talker's model; its service (readiness) is SERVING only while a talker and a decoder
replica are reachable, and the HTTP API's ``/health`` says the same (one process, one event loop,
one health); SIGTERM stops both listeners with exit code 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.ports import free_port
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
SERVICE = "qwen3tts.v1.TextToSpeech"
FAKES = Path(__file__).resolve().parents[2] / "helpers" / "fake_stages.py"


def _wait_for(pattern: str, path: Path, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text(errors="replace"))
        if match:
            return match.group(1)
        assert proc.poll() is None, path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not logged:\n{path.read_text()}")


async def _health(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2, wait_for_ready=True
        )
        return reply.status


def _wait_health(port: int, status: int, service: str, log: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while asyncio.run(_health(port, service)) != status:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


async def _model_type(port: int) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        info = await tts_pb2_grpc.TextToSpeechStub(channel).GetModelInfo(
            tts_pb2.GetModelInfoRequest(), timeout=2
        )
        return info.model_type


def _http_health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_gateway_process_lifecycle(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QWEN3TTS_TALKER_TARGETS": ""}
    talker_port, decoder_port, http_port = free_port(), free_port(), free_port()
    log = tmp_path / "gateway.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(log, "wb") as fh:
            gateway = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--talker-targets",
                    f"127.0.0.1:{talker_port}",
                    "--decoder-targets",
                    f"127.0.0.1:{decoder_port}",
                    "--health-check-interval-seconds",
                    "0.2",
                    "--http-port",
                    str(http_port),
                ],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        procs.append(gateway)
        port = int(_wait_for(r"listening on \S+ \(port (\d+)\)", log, gateway, 20))
        assert asyncio.run(_health(port)) == health_pb2.HealthCheckResponse.NOT_SERVING
        _wait_for(r"(HTTP API listening on http://127\.0\.0\.1:\d+)", log, gateway, 20)
        assert _http_health(http_port) == 503
        talker = subprocess.Popen(
            [sys.executable, str(FAKES), "talker", "base", "3", "0", str(talker_port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        procs.append(talker)
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        _wait_health(port, serving, "", log)
        assert asyncio.run(_model_type(port)) == "base"
        # Readiness: no decoder yet, so the service is NOT_SERVING while the process is up, and
        # the HTTP readiness endpoint agrees.
        assert asyncio.run(_health(port, SERVICE)) == not_serving
        assert _http_health(http_port) == 503
        decoder = subprocess.Popen(
            [sys.executable, str(FAKES), "decoder", str(decoder_port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        procs.append(decoder)
        _wait_health(port, serving, SERVICE, log)
        assert _http_health(http_port) == 200
        talker.kill()  # the only talker replica is gone: not ready, still alive
        _wait_health(port, not_serving, SERVICE, log)
        assert asyncio.run(_health(port)) == serving
        assert _http_health(http_port) == 503
        assert "readiness: talker stage has no reachable replica" in log.read_text()
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(10) == 0, log.read_text()
        with socket.socket() as sock:  # the HTTP listener went with the process
            assert sock.connect_ex(("127.0.0.1", http_port)) != 0
        assert "talker model: fake-base" in log.read_text()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
