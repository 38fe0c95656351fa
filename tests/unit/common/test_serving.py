"""tts_common.serving (the package) on a real grpc.aio server (loopback, port 0): health, reflection as grpcurl
uses it, readiness gating, graceful shutdown (in-process and via SIGTERM to a child process),
error mapping, metrics endpoint, logging with request ids, configuration parsing."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.ports import free_port
from tts_common import errors, metrics
from tts_common.logging_setup import current_request_id, request_context, setup_logging
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
from tts_common.serving.config import ProcessFlags, ServerConfig
from tts_common.serving.health import ServingHealth
from tts_common.serving.lifecycle import serve, serve_until_signal
from tts_common.serving.names import service_name
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import grpc_status_for, handle_rpc_errors
from tts_common.serving.server import bound_port, build_server

REPO = Path(__file__).resolve().parents[3]
TTS = service_name(tts_pb2, "TextToSpeech")
TALKER = service_name(stages_pb2, "Talker")
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 15.0) -> T:
    """Run a test coroutine with a hard timeout (no pytest-asyncio needed)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class FakeTTS(tts_pb2_grpc.TextToSpeechServicer):
    """Streams `chunks` audio chunks `delay` seconds apart; other RPCs exercise error mapping."""

    def __init__(self, chunks: int = 3, delay: float = 0.0) -> None:
        self.chunks = chunks
        self.delay = delay
        self.started = asyncio.Event()

    @handle_rpc_errors(stage="gateway")
    async def Synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        request_id = resolve_request_id(request.request_id, context)
        with request_context(request_id):
            yield tts_pb2.SynthesizeResponse(
                metadata=tts_pb2.SynthesisMetadata(request_id=current_request_id() or "")
            )
            self.started.set()
            for i in range(self.chunks):
                await asyncio.sleep(self.delay)
                if request.text == "fail-midway" and i == 1:
                    raise errors.NotFoundError("voice vanished")
                yield tts_pb2.SynthesizeResponse(audio=tts_pb2.AudioChunk(index=i))
            yield tts_pb2.SynthesizeResponse(
                summary=tts_pb2.SynthesisSummary(
                    num_chunks=self.chunks, finish_reason=tts_pb2.FINISH_REASON_EOS
                )
            )

    @handle_rpc_errors
    async def GetModelInfo(
        self,
        request: tts_pb2.GetModelInfoRequest,
        context: grpc.aio.ServicerContext,
    ) -> tts_pb2.ModelInfo:
        return tts_pb2.ModelInfo(model_type="custom_voice", sample_rate=24000)

    @handle_rpc_errors(stage="gateway")
    async def ListVoices(
        self,
        request: tts_pb2.ListVoicesRequest,
        context: grpc.aio.ServicerContext,
    ) -> tts_pb2.ListVoicesResponse:
        raise errors.InvalidRequestError("language 'klingon' is not supported")

    @handle_rpc_errors
    async def DeleteVoice(
        self,
        request: tts_pb2.DeleteVoiceRequest,
        context: grpc.aio.ServicerContext,
    ) -> tts_pb2.DeleteVoiceResponse:
        if request.voice_id == "busy":
            raise errors.CapacityError("queue full")
        if request.voice_id == "boom":
            raise RuntimeError("kaput")
        raise errors.NotFoundError(f"unknown voice {request.voice_id!r}")


async def start(servicer: FakeTTS, **kwargs: Any) -> tuple[grpc.aio.Server, ServingHealth, str]:
    config = ServerConfig(stage="gateway", host="127.0.0.1", port=0)

    def add(server: grpc.aio.Server) -> None:
        tts_pb2_grpc.add_TextToSpeechServicer_to_server(servicer, server)
        stages_pb2_grpc.add_TalkerServicer_to_server(stages_pb2_grpc.TalkerServicer(), server)

    server, health = build_server(config, add, [TTS, TALKER], **kwargs)
    await server.start()
    return server, health, f"127.0.0.1:{bound_port(server)}"


async def health_status(channel: grpc.aio.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return response.status


async def read_rest(call: Any) -> list[Any]:
    """The remaining messages of a streaming call read with ``read()`` (read() and async
    iteration cannot be mixed on one call)."""
    messages = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        messages.append(msg)
    return messages


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_not_serving_until_ready() -> None:
    async def body() -> None:
        server, health, target = await start(FakeTTS())
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=TTS))
                assert (await watch.read()).status == NOT_SERVING
                for name in ("", TTS, TALKER):
                    assert await health_status(channel, name) == NOT_SERVING
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await health_status(channel, "no.such.Service")
                assert info.value.code() == grpc.StatusCode.NOT_FOUND

                # Model RPCs are refused while not ready; health/reflection keep answering.
                stub = tts_pb2_grpc.TextToSpeechStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetModelInfo(tts_pb2.GetModelInfoRequest(), timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "not serving" in (info.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in stub.Synthesize(tts_pb2.SynthesizeRequest(text="x")):
                        pass
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE

                health.mark_ready()
                assert health.ready
                assert (await watch.read()).status == SERVING
                for name in ("", TTS, TALKER):
                    assert await health_status(channel, name) == SERVING
                info_msg = await stub.GetModelInfo(tts_pb2.GetModelInfoRequest(), timeout=5)
                assert info_msg.sample_rate == 24000

                health.mark_not_serving()
                assert (await watch.read()).status == NOT_SERVING
                watch.cancel()
        finally:
            await server.stop(0)

    run(body())


_HEALTH_STEPS = st.lists(
    st.one_of(
        st.just(("ready", None)),
        st.just(("not_serving", None)),
        st.just(("shutdown", None)),
        st.tuples(st.just("dependency"), st.tuples(st.sampled_from(["a", "b"]), st.booleans())),
    ),
    max_size=12,
)


@given(steps=_HEALTH_STEPS)
def test_health_readiness_and_refusal_reason_follow_the_published_statuses(
    steps: list[tuple[str, Any]],
) -> None:
    """``services_ready`` is what the services' health status says, and ``refusal_reason`` is
    None exactly while the overall status is SERVING, naming a shutdown as such."""
    health = ServingHealth([TTS])
    marked = shutting_down = False
    dependencies: dict[str, bool] = {}
    for step, argument in [("start", None), *steps]:
        if step == "ready":
            health.mark_ready()
            marked = True
        elif step == "not_serving":
            health.mark_not_serving()
            marked = False
        elif step == "shutdown":
            health.enter_graceful_shutdown()
            shutting_down = True
        elif step == "dependency":
            health.set_dependency(*argument)
            dependencies[argument[0]] = argument[1]
        up = marked and not shutting_down
        assert health.ready is up
        assert health.status("") == (SERVING if up else NOT_SERVING)
        assert health.services_ready is (up and all(dependencies.values()))
        assert health.status(TTS) == (SERVING if health.services_ready else NOT_SERVING)
        if up:
            assert health.refusal_reason() is None
        elif shutting_down:
            assert health.refusal_reason() == "server shutting down"
        else:
            assert health.refusal_reason() == "server not serving (starting up or unhealthy)"


async def reflect(
    channel: grpc.aio.Channel, *requests: reflection_pb2.ServerReflectionRequest
) -> list[reflection_pb2.ServerReflectionResponse]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(iter(requests), timeout=5)
    return [response async for response in call]


def test_reflection_lists_services_and_serves_descriptors() -> None:
    async def body() -> None:
        server, _health, target = await start(FakeTTS())  # reflection works before ready
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                # What `grpcurl -plaintext HOST:PORT list` sends.
                (listed,) = await reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
                names = {s.name for s in listed.list_services_response.service}
                assert names == {
                    TTS,
                    TALKER,
                    "grpc.health.v1.Health",
                    "grpc.reflection.v1alpha.ServerReflection",
                }

                # What `grpcurl describe qwen3tts.internal.v1.Talker` sends: the file containing
                # the symbol plus its dependencies (tts.proto, timestamp.proto).
                (by_symbol,) = await reflect(
                    channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=TALKER)
                )
                files = {}
                for raw in by_symbol.file_descriptor_response.file_descriptor_proto:
                    proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
                    files[proto.name] = proto
                assert "qwen3tts/internal/v1/stages.proto" in files
                stages = files["qwen3tts/internal/v1/stages.proto"]
                assert "qwen3tts/v1/tts.proto" in stages.dependency
                talker = next(s for s in stages.service if s.name == "Talker")
                generate = next(m for m in talker.method if m.name == "Generate")
                assert generate.client_streaming and generate.server_streaming
                assert generate.input_type == ".qwen3tts.internal.v1.TalkerClientMessage"

                # Message symbols and file names resolve as well (grpcurl's request builder).
                (by_message, by_file) = await reflect(
                    channel,
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="qwen3tts.v1.SynthesizeRequest"
                    ),
                    reflection_pb2.ServerReflectionRequest(
                        file_by_filename="google/protobuf/timestamp.proto"
                    ),
                )
                first = descriptor_pb2.FileDescriptorProto.FromString(
                    by_message.file_descriptor_response.file_descriptor_proto[0]
                )
                assert first.name == "qwen3tts/v1/tts.proto"
                assert "SynthesizeRequest" in {m.name for m in first.message_type}
                assert by_file.file_descriptor_response.file_descriptor_proto
        finally:
            await server.stop(0)

    run(body())


def test_graceful_stop_lets_in_flight_stream_finish() -> None:
    async def body() -> None:
        servicer = FakeTTS(chunks=5, delay=0.1)
        server, health, target = await start(servicer)
        health.mark_ready()
        stop = asyncio.Event()
        serving_task = asyncio.ensure_future(
            serve_until_signal(server, health, grace=5.0, stop_event=stop, signals=())
        )
        async with grpc.aio.insecure_channel(target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            call = stub.Synthesize(tts_pb2.SynthesizeRequest(text="hi", request_id="keep"))
            first = await call.read()
            assert first.metadata.request_id == "keep"
            t0 = time.monotonic()
            stop.set()
            await asyncio.sleep(0.05)
            assert health.status() == NOT_SERVING and health.status(TTS) == NOT_SERVING
            health.mark_ready()  # ignored once shutting down
            assert health.status() == NOT_SERVING

            # New calls are refused during the grace period (new connections too).
            async with grpc.aio.insecure_channel(target) as fresh:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await tts_pb2_grpc.TextToSpeechStub(fresh).GetModelInfo(
                        tts_pb2.GetModelInfoRequest(), timeout=2
                    )
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE

            rest = await read_rest(call)
            assert [m.WhichOneof("payload") for m in rest] == ["audio"] * 5 + ["summary"]
            assert await call.code() == grpc.StatusCode.OK
            await asyncio.wait_for(serving_task, 5)
            assert time.monotonic() - t0 < 3.0  # stop returned when the stream ended

    run(body())


def test_grace_period_expiry_cancels_stream() -> None:
    async def body() -> None:
        server, health, target = await start(FakeTTS(chunks=100, delay=0.1))
        health.mark_ready()
        stop = asyncio.Event()
        task = asyncio.ensure_future(
            serve_until_signal(server, health, grace=0.3, stop_event=stop, signals=())
        )
        async with grpc.aio.insecure_channel(target) as channel:
            call = tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(tts_pb2.SynthesizeRequest(text="long"))
            await call.read()
            t0 = time.monotonic()
            stop.set()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await read_rest(call)
            assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
            await asyncio.wait_for(task, 5)
            assert time.monotonic() - t0 < 2.0

    run(body())


CHILD = textwrap.dedent("""
    import asyncio, sys
    from tts_common.logging_setup import setup_logging
    from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
    from tts_common.serving.config import ProcessFlags
    from tts_common.serving.lifecycle import serve
    from tts_common.serving.names import service_name

    class Slow(tts_pb2_grpc.TextToSpeechServicer):
        async def Synthesize(self, request, context):
            for i in range(4):
                yield tts_pb2.SynthesizeResponse(audio=tts_pb2.AudioChunk(index=i))
                await asyncio.sleep(0.15)

    config, _ = ProcessFlags(stage="gateway", default_port=0).parse()
    setup_logging(config.log_level, stage=config.stage)

    async def startup():
        await asyncio.sleep(0.05)  # stands in for model loading

    async def main():
        servicer = Slow()
        def add(server):
            tts_pb2_grpc.add_TextToSpeechServicer_to_server(servicer, server)
        await serve(config, add, [service_name(tts_pb2, "TextToSpeech")],
                            startup=startup)
        print("CLEAN EXIT", flush=True)

    asyncio.run(main())
""")


def test_sigterm_finishes_stream_and_exits_zero() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "QWEN3TTS_GATEWAY_HOST": "127.0.0.1",
        "QWEN3TTS_GRACE_SECONDS": "5",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        log_lines = []
        while not (
            match := re.search(r"listening on \S+ \(port (\d+)\)", log_lines[-1] if log_lines else "")
        ):
            line = proc.stderr.readline()
            assert line, "child exited early:\n" + "".join(log_lines)
            log_lines.append(line)
        target = f"127.0.0.1:{match.group(1)}"
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 10
            while health.Check(health_pb2.HealthCheckRequest()).status != SERVING:
                assert time.monotonic() < deadline, "never became ready"
                time.sleep(0.02)
            stream = tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
                tts_pb2.SynthesizeRequest(text="hi"), timeout=10
            )
            first = next(stream)
            proc.send_signal(signal.SIGTERM)
            rest = list(stream)
            assert [first.audio.index] + [m.audio.index for m in rest] == [0, 1, 2, 3]
            assert stream.code() == grpc.StatusCode.OK
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "CLEAN EXIT" in out
        err = "".join(log_lines) + err
        assert "shutting down gracefully" in err and "gateway" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_errors_map_to_status_codes() -> None:
    async def body() -> None:
        server, health, target = await start(FakeTTS())
        health.mark_ready()
        before = metrics.REQUESTS.labels(stage="gateway", status="INVALID_ARGUMENT")._value.get()
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = tts_pb2_grpc.TextToSpeechStub(channel)
                cases = [
                    (
                        stub.ListVoices(tts_pb2.ListVoicesRequest()),
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "klingon",
                    ),
                    (
                        stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id="v9")),
                        grpc.StatusCode.NOT_FOUND,
                        "v9",
                    ),
                    (
                        stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id="busy")),
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "queue full",
                    ),
                    (
                        stub.DeleteVoice(tts_pb2.DeleteVoiceRequest(voice_id="boom")),
                        grpc.StatusCode.INTERNAL,
                        "internal error; the details are in the server log",  # never "kaput"
                    ),
                ]
                for call, code, text in cases:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call
                    assert info.value.code() == code
                    assert text in (info.value.details() or "")
                    assert "kaput" not in (info.value.details() or "")

                # A streaming handler failing after some output.
                call = stub.Synthesize(tts_pb2.SynthesizeRequest(text="fail-midway"))
                got = []
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for msg in call:
                        got.append(msg.WhichOneof("payload"))
                assert got == ["metadata", "audio"]
                assert info.value.code() == grpc.StatusCode.NOT_FOUND

                # Request id from call metadata when the message has none.
                call = stub.Synthesize(
                    tts_pb2.SynthesizeRequest(text="ok"), metadata=[("x-request-id", "from-meta")]
                )
                assert (await call.read()).metadata.request_id == "from-meta"
                call.cancel()
        finally:
            await server.stop(0)
        after = metrics.REQUESTS.labels(stage="gateway", status="INVALID_ARGUMENT")._value.get()
        assert after == before + 1

    run(body())


def test_status_mapping_table() -> None:
    status = grpc.StatusCode
    assert grpc_status_for(errors.InvalidRequestError("x")) is status.INVALID_ARGUMENT
    assert grpc_status_for(errors.NotFoundError("x")) is status.NOT_FOUND
    assert grpc_status_for(errors.CapacityError("x")) is status.RESOURCE_EXHAUSTED
    assert grpc_status_for(errors.UnavailableError("x")) is status.UNAVAILABLE
    assert grpc_status_for(errors.AlreadyExistsError("x")) is status.ALREADY_EXISTS
    assert grpc_status_for(errors.FailedPreconditionError("x")) is status.FAILED_PRECONDITION
    assert grpc_status_for(asyncio.TimeoutError()) is status.DEADLINE_EXCEEDED
    assert grpc_status_for(NotImplementedError()) is status.UNIMPLEMENTED
    assert grpc_status_for(ValueError("plain")) is status.INTERNAL  # only our subclasses
    assert isinstance(errors.InvalidRequestError("x"), ValueError)
    assert isinstance(errors.NotFoundError("x"), LookupError)


def test_metrics_endpoint_serves_all_names() -> None:
    assert metrics.start_metrics_server(0) is None  # 0 = disabled
    metrics.init_stage("talker")
    metrics.TIME_TO_FIRST_AUDIO.labels(stage="talker").observe(0.2)
    metrics.BATCH_SIZE.labels(stage="talker").observe(8)
    metrics.REQUESTS.labels(stage="talker", status="OK").inc()
    metrics.CACHE_LOOKUPS.labels(stage="speaker", result="hit").inc()
    server = metrics.start_metrics_server(free_port(), host="127.0.0.1")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.status == 200
            text = r.read().decode()
    finally:
        server.close()
    for name in metrics.METRIC_NAMES:
        assert name.startswith("qwen3tts_")
        assert f"# TYPE {name} " in text, name
    assert 'qwen3tts_time_to_first_audio_seconds_bucket{le="0.3",stage="talker"}' in text
    assert 'qwen3tts_requests_total{stage="talker",status="OK"}' in text
    assert 'qwen3tts_running_requests{stage="talker"} 0.0' in text


def test_logging_tags_request_ids() -> None:
    stream = io.StringIO()
    handler = setup_logging("DEBUG", stage="talker", stream=stream)
    log = logging.getLogger("tests.serving")
    try:

        async def worker(request_id: str) -> None:
            with request_context(request_id):
                await asyncio.sleep(0.01)
                log.info("step of %s", request_id)

        async def both() -> None:
            await asyncio.gather(worker("aaa"), worker("bbb"))

        log.info("outside")
        run(both())
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    outside = next(line for line in lines if line.endswith("outside"))
    assert "[req=" not in outside and " talker tests.serving " in outside
    assert any("[req=aaa] step of aaa" in line for line in lines)
    assert any("[req=bbb] step of bbb" in line for line in lines)
    assert current_request_id() is None


def test_config_flags_env_and_defaults() -> None:
    env = {
        "QWEN3TTS_TALKER_PORT": "6001",
        "QWEN3TTS_PORT": "7777",
        "QWEN3TTS_GRACE_SECONDS": "12.5",
        "QWEN3TTS_TALKER_LOG_LEVEL": "debug",
        "QWEN3TTS_METRICS_PORT": "9999",
    }
    config, _ = ProcessFlags("talker", 50052).parse([], env=env)
    assert config.stage == "talker" and config.port == 6001  # stage-specific env
    assert config.grace_seconds == 12.5  # generic env
    assert config.log_level == "debug"
    assert config.metrics_port == 0  # ports have no stage-independent fallback
    config, _ = ProcessFlags("talker", 50052).parse(["--port", "1234", "--host", "::1"], env=env)
    assert config.port == 1234 and config.address == "[::1]:1234"  # flags win
    config, _ = ProcessFlags("decoder", 50053).parse([], env={})
    assert config.port == 50053 and config.host == "[::]" and config.metrics_port == 0
    with pytest.raises(SystemExit):
        ProcessFlags("talker", 1).parse([], env={"QWEN3TTS_TALKER_PORT": "nope"})


def test_serve_stops_during_startup() -> None:
    async def body() -> None:
        stop = asyncio.Event()
        loaded: list[bool] = []

        async def slow_startup() -> None:
            stop.set()
            await asyncio.sleep(30)
            loaded.append(True)

        await serve(
            ServerConfig(host="127.0.0.1", port=0),
            lambda s: None,
            [],
            startup=slow_startup,
            stop_event=stop,
        )
        assert loaded == []

    run(body(), timeout=10)


def test_serve_propagates_startup_failure() -> None:
    async def failing() -> None:
        raise RuntimeError("weights missing")

    with pytest.raises(RuntimeError, match="weights missing"):
        run(serve(ServerConfig(host="127.0.0.1", port=0), lambda s: None, [], startup=failing))


class _Companion:
    """Records what the lifecycle does to a companion server."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[tuple[str, object]] = []
        self.health: ServingHealth | None = None

    async def start(self, health: ServingHealth) -> None:
        if self.fail:
            raise RuntimeError("port in use")
        self.health = health
        self.events.append(("start", health.ready))

    async def stop(self, grace: float) -> None:
        assert self.health is not None
        self.events.append(("stop", (grace, self.health.ready, self.health.shutting_down)))


def test_serve_runs_companions_with_the_server() -> None:
    """Started while NOT_SERVING (startup still running), sharing the health that then turns
    SERVING; stopped with the server's grace once shutting down; a companion failing to start
    stops the process."""

    async def body() -> None:
        stop = asyncio.Event()
        companion = _Companion()

        async def startup() -> None:
            assert companion.events == [("start", False)]

        async def stopper() -> None:
            while companion.health is None or not companion.health.ready:
                await asyncio.sleep(0.01)
            stop.set()

        task = asyncio.create_task(stopper())
        config = ServerConfig(host="127.0.0.1", port=0, grace_seconds=7.0)
        await serve(config, lambda s: None, [], startup=startup, stop_event=stop, companions=[companion])
        await task
        assert companion.events == [("start", False), ("stop", (7.0, False, True))]
        broken, fine = _Companion(fail=True), _Companion()
        with pytest.raises(RuntimeError, match="port in use"):
            await serve(config, lambda s: None, [], stop_event=stop, companions=[fine, broken])
        assert [kind for kind, _ in fine.events] == ["start", "stop"]  # the started one is stopped

    run(body(), timeout=10)
