"""``python -m aligner_service`` as deployed: the real process on the dev aligner checkpoint
(qwen3_tts.dev_aligner, random weights), reporting SERVING after loading, aligning a request,
answering GetModelInfo, and exiting 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.ports import free_port
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.names import service_name

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def dev_aligner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qwen3_tts.dev_aligner import make_dev_aligner

    return make_dev_aligner(tmp_path_factory.mktemp("dev-aligner") / "ckpt")


def test_process_serves_and_drains(dev_aligner: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN3TTS_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aligner_service",
            "--model",
            str(dev_aligner),
            "--device",
            "cpu",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 120
            status = None
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    status = health.Check(
                        health_pb2.HealthCheckRequest(service=service_name(stages_pb2, "Aligner")), timeout=2
                    ).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
            assert status == health_pb2.HealthCheckResponse.SERVING, proc.poll()
            stub = stages_pb2_grpc.AlignerStub(channel)
            info = stub.GetModelInfo(stages_pb2.GetModelInfoRequest(), timeout=10)
            assert (info.sample_rate, info.timestamp_resolution_ms) == (16000, 80.0)
            assert (info.device, info.dtype, info.model_name) == ("cpu", "float32", "ckpt")
            audio = (0.1 * np.sin(np.arange(24000) / 5.0)).astype("<f4")
            text = "Word timings, from the dev aligner."
            reply = stub.Align(
                stages_pb2.AlignRequest(
                    pcm=audio.tobytes(), sample_rate=24000, text=text, language="english"
                ),
                timeout=30,
            )
            assert [u.text for u in reply.units] == ["Word", "timings", "from", "the", "dev", "aligner"]
            times = [t for u in reply.units for t in (u.start_ms, u.end_ms)]
            assert times == sorted(times) and all(t >= 0 for t in times)
            with pytest.raises(grpc.RpcError) as info_error:
                stub.Align(stages_pb2.AlignRequest(pcm=b"", sample_rate=24000, text="x"), timeout=10)
            assert info_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
