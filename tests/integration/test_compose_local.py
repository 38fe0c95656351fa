"""deploy/docker-compose.yml run WITHOUT Docker: each service as a local process, compose-style.

The compose model is resolved exactly as in tests/helpers/compose.py (interpolation with
the documented defaults, the CPU override merged). Then every service is started the way its
container would start it: through deploy/docker-entrypoint.sh with the service's own `command`
and `environment`, in `depends_on` order (`service_completed_successfully` waits for the one-shot
`model-init`, which creates the dev checkpoint through the entrypoint; `service_healthy` waits for
gRPC health SERVING). Only what a container provides and a host does not is rewritten:

* service hostnames (``talker``, ``dns:///talker:50052``) and the bind address ``0.0.0.0`` →
  ``127.0.0.1`` (one network namespace instead of a Docker network);
* volume mount targets (``/models/checkpoint``, ``/var/lib/qwen3tts/voices``) → temporary
  directories, one per volume source, so services sharing a volume share the directory;
* ``python`` and ``qwen3-tts`` on PATH → this interpreter and the repository's CLI (the image's
  venv), and ``OMP_NUM_THREADS=1`` so four processes fit on a small CI machine.

The ports are the compose file's own (gRPC 50051-50054, metrics 9091-9094): the test is about
those. If one of them is in use on this machine the test is skipped, saying which.

Then: one greedy Synthesize of "Hello world." through the gateway with a speaker from ListVoices
(metadata, ordered audio chunks, a summary consistent with them), every compose healthcheck
command exits 0, every /metrics endpoint answers, and SIGTERM (gateway first, as `docker compose
down` does) makes every process drain and exit 0 within its stop_grace_period.

The GPU variant (docker-compose.yml alone: CUDA, bf16 talker) runs where CUDA is available.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import compose
from tts_common import metrics
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy" / "docker-entrypoint.sh"
REQUIRED_MODULES = (
    "talker_service.__main__",
    "decoder_service.__main__",
    "speaker_service.__main__",
    "gateway.__main__",
    "qwen3_tts.cli",
)
START_TIMEOUT = 240.0
"""Seconds for a one-shot service to finish or a server to report SERVING."""

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------
# Translating a compose service into a local process


@dataclass
class LocalService:
    """One compose service as a local process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    depends_on: dict[str, str]
    oneshot: bool
    grpc_port: int | None = None
    http_port: int | None = None
    metrics_port: int | None = None
    stop_grace: float = 10.0
    healthcheck: list[str] | None = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    _log: Any = field(default=None, repr=False)

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


def _localize(value: str, hosts: list[str], volume_dirs: dict[str, Path]) -> str:
    """Rewrite what differs between a container and this host (see the module doc)."""
    for target, local in sorted(volume_dirs.items(), key=lambda kv: -len(kv[0])):
        value = re.sub(rf"(?<![\w/]){re.escape(target)}(?=$|/|[^\w])", str(local), value)
    for host in hosts:
        value = re.sub(rf"(?<![\w.-]){re.escape(host)}(?=:\d)", "127.0.0.1", value)
    return "127.0.0.1" if value == "0.0.0.0" else value


def _shims(directory: Path) -> Path:
    """``python`` and ``qwen3-tts`` as the image's venv provides them (this interpreter, the
    repository's packages)."""
    directory.mkdir(parents=True, exist_ok=True)
    python = directory / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    cli = directory / "qwen3-tts"
    cli.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m qwen3_tts.cli "$@"\n')
    for path in (python, cli):
        path.chmod(0o755)
    return directory


def local_services(model: dict[str, Any], tmp: Path) -> list[LocalService]:
    """The resolved compose model as local processes, in a valid start order."""
    services = model["services"]
    hosts = sorted(services, key=len, reverse=True)
    volume_root = tmp / "volumes"
    bin_dir = _shims(tmp / "bin")
    base_env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp / "home"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    (tmp / "home").mkdir(parents=True, exist_ok=True)
    result = []
    for name in _start_order(services):
        svc = services[name]
        volume_dirs = {}
        for volume in svc.get("volumes") or []:
            key = re.sub(r"[^\w.-]", "_", volume["source"].strip("/")) or "anonymous"
            volume_dirs[volume["target"]] = volume_root / key
            (volume_root / key).mkdir(parents=True, exist_ok=True)
        argv = [_localize(a, hosts, volume_dirs) for a in svc["command"]]
        env = dict(base_env)
        for key, value in (svc.get("environment") or {}).items():
            if value is not None:
                env[key] = _localize(value, hosts, volume_dirs)
        proc = compose.service_process(svc)
        health = (svc.get("healthcheck") or {}).get("test")
        result.append(
            LocalService(
                name=name,
                argv=["sh", str(ENTRYPOINT), *argv],
                env=env,
                depends_on={d: spec["condition"] for d, spec in (svc.get("depends_on") or {}).items()},
                oneshot=proc is None,
                grpc_port=proc[1].port if proc else None,
                http_port=compose.http_port(svc) if proc and proc[0] == "gateway" else None,
                metrics_port=proc[1].metrics_port if proc else None,
                stop_grace=compose.parse_duration(svc.get("stop_grace_period", "10s")),
                healthcheck=[_localize(a, hosts, volume_dirs) for a in health[1:]]
                if health and health[0] == "CMD"
                else None,
            )
        )
    return result


def _start_order(services: dict[str, Any]) -> list[str]:
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dep in services[name].get("depends_on") or {}:
            visit(dep)
        order.append(name)

    for name in sorted(services):
        visit(name)
    return order


# ---------------------------------------------------------------------------------------------
# Process control


def _port_in_use(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return True
    return False


def _serving(port: int, timeout: float = 1.0) -> bool:
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _start(service: LocalService, log_dir: Path) -> None:
    service.log_path = log_dir / f"{service.name}.log"
    service._log = open(service.log_path, "ab")
    service.process = subprocess.Popen(
        service.argv, env=service.env, cwd=REPO, stdout=service._log, stderr=subprocess.STDOUT
    )


def _wait_for(service: LocalService, condition: str, everyone: list[LocalService]) -> None:
    """Block until ``service`` satisfies a depends_on ``condition`` (or fail with its log)."""
    deadline = time.monotonic() + START_TIMEOUT
    assert service.process is not None
    while time.monotonic() < deadline:
        code = service.process.poll()
        if condition == "service_completed_successfully":
            if code is not None:
                assert code == 0, f"{service.name} exited {code}:\n{service.log_tail()}"
                return
        else:
            assert code is None, f"{service.name} exited {code} during start-up:\n{service.log_tail()}"
            if condition == "service_started" or (
                service.grpc_port is not None and _serving(service.grpc_port)
            ):
                return
        time.sleep(0.25)
    logs = "\n".join(f"--- {s.name}\n{s.log_tail(2000)}" for s in everyone)
    pytest.fail(f"{service.name}: not {condition} after {START_TIMEOUT:.0f}s\n{logs}")


def _stop_all(services: list[LocalService]) -> dict[str, int | None]:
    """Stop like `docker compose down`: dependents before their dependencies (the gateway, then
    the stages together), SIGTERM, each given its stop_grace_period, then SIGKILL. Returns the
    exit codes (None: had to be killed)."""
    by_name = {s.name: s for s in services}
    depth: dict[str, int] = {}
    for service in services:  # in start order, so dependencies come first
        depth[service.name] = 1 + max((depth[d] for d in service.depends_on), default=0)
    codes: dict[str, int | None] = {}
    for level in sorted(set(depth.values()), reverse=True):
        group = [by_name[n] for n, d in depth.items() if d == level and by_name[n].process]
        for service in group:
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in group:
            try:
                codes[service.name] = service.process.wait(timeout=service.stop_grace)
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait(timeout=10)
                codes[service.name] = None
    for service in services:
        if service._log is not None:
            service._log.close()
    return codes


@pytest.fixture()
def stack_of(tmp_path: Path) -> Iterator:
    """Start a resolved compose model as local processes; stopped (and killed) at the end."""
    started: list[LocalService] = []

    def start(model: dict[str, Any]) -> list[LocalService]:
        services = local_services(model, tmp_path)
        ports = [p for s in services for p in (s.grpc_port, s.http_port, s.metrics_port) if p]
        busy = [p for p in ports if _port_in_use(p)]
        if busy:
            pytest.skip(f"compose ports in use on this machine: {busy}")
        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        for service in services:
            for dep, condition in service.depends_on.items():
                _wait_for(next(s for s in started if s.name == dep), condition, started)
            _start(service, log_dir)
            started.append(service)
        for service in started:  # every server up, as `docker compose up --wait` would wait
            _wait_for(
                service, "service_completed_successfully" if service.oneshot else "service_healthy", started
            )
        return started

    yield start
    for service in started:  # whatever the test left running (after a failure)
        if service.process is not None and service.process.poll() is None:
            service.process.kill()
            service.process.wait(timeout=10)
        if service._log is not None and not service._log.closed:
            service._log.close()


# ---------------------------------------------------------------------------------------------
# The test


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize(
    "variant",
    [
        "cpu",
        pytest.param("gpu", marks=pytest.mark.skipif(not _cuda_available(), reason="needs CUDA")),
    ],
)
def test_compose_services_run_as_local_processes(variant: str, stack_of) -> None:
    missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"stage processes not available yet: {missing}")
    model = compose.load_compose(compose.VARIANTS[variant], {})
    services = stack_of(model)
    by_name = {s.name: s for s in services}
    gateway = next(s for s in services if s.argv[2:5] == ["python", "-m", "gateway"])

    try:
        with grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            voices = stub.ListVoices(tts_pb2.ListVoicesRequest(), timeout=30)
            assert voices.speakers, "the dev checkpoint (custom_voice) has preset speakers"
            request = tts_pb2.SynthesizeRequest(
                text="Hello world.",
                language="english",
                speaker=voices.speakers[0].name,
                sampling=tts_pb2.SamplingOptions(
                    do_sample=False, subtalker_do_sample=False, max_new_tokens=20
                ),
            )
            responses = list(stub.Synthesize(request, timeout=120))
        _check_stream(responses, max_frames=19)

        for service in services:
            if service.healthcheck is not None:
                result = subprocess.run(
                    service.healthcheck, env=service.env, cwd=REPO, capture_output=True, text=True, timeout=60
                )
                assert result.returncode == 0, (
                    f"{service.name} healthcheck {service.healthcheck}: {result.stderr}"
                )
            if service.metrics_port:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=10
                ) as reply:
                    text = reply.read().decode()
                assert f"{metrics.PREFIX}ready" in text, service.name
        with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10) as reply:
            assert 'qwen3tts_requests_total{stage="gateway",status="OK"}' in reply.read().decode()
    except BaseException:
        logs = "\n".join(f"--- {s.name}\n{s.log_tail(2000)}" for s in services)
        print(logs)  # shown by pytest on failure
        raise

    codes = _stop_all(services)
    logs = "\n".join(f"--- {s.name}\n{s.log_tail(1500)}" for s in services)
    for name, code in codes.items():
        assert code == 0, (
            f"{name} exited {code} after SIGTERM (None: not within "
            f"stop_grace_period {by_name[name].stop_grace}s)\n{logs}"
        )


def _check_stream(responses: list[tts_pb2.SynthesizeResponse], max_frames: int) -> None:
    """One metadata first, audio chunks in order, one summary last, all consistent."""
    kinds = [r.WhichOneof("payload") for r in responses]
    assert kinds[0] == "metadata" and kinds[-1] == "summary", kinds
    assert kinds.count("metadata") == 1 and kinds.count("summary") == 1
    metadata = responses[0].metadata
    summary = responses[-1].summary
    chunks = [r.audio for r in responses if r.WhichOneof("payload") == "audio"]
    assert chunks, "no audio chunk arrived"
    assert metadata.sample_rate == 24000 and metadata.encoding == tts_pb2.AUDIO_ENCODING_PCM16
    position = 0
    for index, chunk in enumerate(chunks):
        assert chunk.index == index
        assert chunk.start_sample == position
        assert chunk.sample_rate == metadata.sample_rate
        assert chunk.encoding == metadata.encoding
        assert len(chunk.data) == 2 * chunk.num_samples  # PCM16, mono
        position += chunk.num_samples
    assert summary.num_chunks == len(chunks)
    assert summary.num_samples == position > 0
    assert 1 <= summary.frames <= max_frames
    assert summary.num_samples == summary.frames * 1920  # 80 ms frames at 24 kHz
    assert summary.audio_seconds == pytest.approx(position / metadata.sample_rate, rel=1e-6)
    assert summary.finish_reason in (tts_pb2.FINISH_REASON_EOS, tts_pb2.FINISH_REASON_LENGTH)
    assert 0 < summary.time_to_first_audio_ms <= summary.total_ms
