"""The aligner servicer over real gRPC with a fake model: units and times, batching across
concurrent calls, the statuses of bad input, stats and model info, and the stage lifecycle
(health, reflection, graceful drain)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from aligner_service.config import FLAGS, AlignerConfig
from aligner_service.server import AlignerServicer
from aligner_service.text import repair_timestamps, split_units
from tests.helpers.ports import free_port
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.config import ServerConfig
from tts_common.serving.lifecycle import serve
from tts_common.serving.names import service_name
from tts_common.serving.server import bound_port, build_server

from .fake_model import FakeAligner, FakeInput, fake_loader

T = TypeVar("T")
ALIGNER = service_name(stages_pb2, "Aligner")


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def pcm(seconds: float, rate: int = 24000) -> bytes:
    n = int(round(seconds * rate))
    return (0.1 * np.sin(np.arange(n) / 7.0)).astype("<f4").tobytes()


def servicer_for(model: FakeAligner, **config: Any) -> AlignerServicer:
    return AlignerServicer(
        "/ckpt/fake", AlignerConfig(**config), load_model=fake_loader(model), make_input=FakeInput
    )


async def started(servicer: AlignerServicer, *, load: bool = True) -> tuple[grpc.aio.Server, str]:
    def add(server: grpc.aio.Server) -> None:
        stages_pb2_grpc.add_AlignerServicer_to_server(servicer, server)

    server, health = build_server(ServerConfig(stage="aligner", host="127.0.0.1", port=0), add, [ALIGNER])
    await server.start()
    if load:
        await servicer.load()
        health.mark_ready()
    return server, f"127.0.0.1:{bound_port(server)}"


async def stopped(server: grpc.aio.Server, servicer: AlignerServicer) -> None:
    await server.stop(None)
    await servicer.close()


def with_stub(servicer: AlignerServicer, body, *, load: bool = True, timeout: float = 20.0):
    async def main() -> Any:
        server, target = await started(servicer, load=load)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                return await body(stages_pb2_grpc.AlignerStub(channel))
        finally:
            await stopped(server, servicer)

    return run(main(), timeout)


def request(text: str, seconds: float = 1.0, rate: int = 24000, **kwargs: Any) -> stages_pb2.AlignRequest:
    return stages_pb2.AlignRequest(pcm=pcm(seconds, rate), sample_rate=rate, text=text, **kwargs)


def test_words_get_their_spans_and_times() -> None:
    model = FakeAligner()
    text = "Hello, world! It's a 3.5-hour trip."

    async def body(stub):
        return await stub.Align(request(text, 1.0, language="english"), timeout=10)

    reply = with_stub(servicer_for(model), body)
    units = split_units(text, "english")
    assert (
        [u.text for u in reply.units]
        == [u.text for u in units]
        == ["Hello", "world", "It's", "a", "35hour", "trip"]
    )
    assert [text[u.char_start : u.char_end] for u in reply.units] == [
        "Hello",
        "world",
        "It's",
        "a",
        "3.5-hour",
        "trip",
    ]
    classes = FakeAligner.expected_classes(FakeInput(np.zeros(24000), 24000, [u.text for u in units]))
    assert [(u.start_ms, u.end_ms) for u in reply.units] == [
        (80.0 * classes[2 * i], 80.0 * classes[2 * i + 1]) for i in range(len(units))
    ]
    assert reply.align_ms > 0
    (batch,) = model.batches
    assert (
        batch[0].sample_rate == 24000 and batch[0].audio.dtype == np.float32 and len(batch[0].audio) == 24000
    )


def test_times_are_repaired() -> None:
    model = FakeAligner(reverse=True)  # falling classes: the repair flattens them

    async def body(stub):
        return await stub.Align(request("one two three", 0.5), timeout=10)

    reply = with_stub(servicer_for(model), body)
    raw = FakeAligner.expected_classes(FakeInput(np.zeros(12000), 24000, ["one", "two", "three"]))[::-1]
    expected = repair_timestamps([80.0 * c for c in raw])
    assert expected != [80 * c for c in raw]
    assert [t for u in reply.units for t in (u.start_ms, u.end_ms)] == expected


def test_character_units_and_languages() -> None:
    model = FakeAligner()

    async def body(stub):
        chars = await stub.Align(request("It's 中文", unit=stages_pb2.ALIGN_UNIT_CHARACTER), timeout=10)
        korean = await stub.Align(request("대회장에 갔다", language="Korean"), timeout=10)
        return chars, korean

    chars, korean = with_stub(servicer_for(model), body)
    assert [u.text for u in chars.units] == ["I", "t", "s", "中", "文"]
    assert [(u.char_start, u.char_end) for u in chars.units] == [(0, 1), (1, 2), (3, 4), (5, 6), (6, 7)]
    assert [u.text for u in korean.units] == [u.text for u in split_units("대회장에 갔다", "korean")]


def test_text_without_letters_or_digits_gets_no_units_and_no_forward() -> None:
    model = FakeAligner()

    async def body(stub):
        return await stub.Align(request(" ... !? "), timeout=10)

    reply = with_stub(servicer_for(model), body)
    assert list(reply.units) == [] and model.batches == []


def test_concurrent_calls_share_a_forward_pass_and_get_their_own_rows() -> None:
    model = FakeAligner(delay_s=0.05)
    texts = [" ".join(f"w{i}x{k}" for k in range(i + 1)) for i in range(10)]

    async def body(stub):
        calls = [stub.Align(request(t, 0.5 + 0.1 * i), timeout=10) for i, t in enumerate(texts)]
        return await asyncio.gather(*calls)

    replies = with_stub(servicer_for(model, max_batch_size=4, batch_wait_ms=100.0), body)
    assert max(len(b) for b in model.batches) > 1, "no batching"
    assert all(len(b) <= 4 for b in model.batches)
    assert sum(len(b) for b in model.batches) == len(texts)
    for i, (text, reply) in enumerate(zip(texts, replies)):
        words = text.split()
        assert [u.text for u in reply.units] == words
        expected = FakeAligner.expected_classes(
            FakeInput(np.zeros(int(round((0.5 + 0.1 * i) * 24000))), 24000, words)
        )
        assert [t for u in reply.units for t in (u.start_ms, u.end_ms)] == [80.0 * c for c in expected]
    assert model.threads == {t for t in model.threads if t.startswith("aligner-compute")}


BAD = [
    (stages_pb2.AlignRequest(pcm=b"", sample_rate=24000, text="hi"), "empty"),
    (stages_pb2.AlignRequest(pcm=b"\x00" * 7, sample_rate=24000, text="hi"), "not a multiple of 4"),
    (
        stages_pb2.AlignRequest(pcm=np.array([0.0, np.nan], "<f4").tobytes(), sample_rate=24000, text="hi"),
        "NaN",
    ),
    (stages_pb2.AlignRequest(pcm=pcm(0.1), sample_rate=0, text="hi"), "sample rate"),
    (stages_pb2.AlignRequest(pcm=pcm(0.1), sample_rate=24000, text="hi", unit=7), "AlignUnit"),
    (request("too long", 31.0, 8000), "too long"),
    (request("too short", 0.01, 24000), "too short"),
]


@pytest.mark.parametrize(("bad", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_invalid_argument(bad: stages_pb2.AlignRequest, message: str) -> None:
    model = FakeAligner()

    async def body(stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Align(bad, timeout=10)
        return info.value

    error = with_stub(servicer_for(model), body)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert message in error.details()


def test_one_bad_input_fails_alone_in_its_batch() -> None:
    model = FakeAligner(delay_s=0.05)

    async def body(stub):
        good = [stub.Align(request(f"word {i}", 0.5), timeout=10) for i in range(3)]
        bad = stub.Align(request("short", 0.01), timeout=10)
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *goods, bad = with_stub(servicer_for(model, max_batch_size=8, batch_wait_ms=100.0), body)
    assert isinstance(bad, grpc.aio.AioRpcError) and bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert all(isinstance(g, stages_pb2.AlignResponse) and len(g.units) == 2 for g in goods)


def test_a_caller_that_gives_up_is_dropped_and_the_others_are_served() -> None:
    """A call whose deadline passes while it waits for a forward pass ends DEADLINE_EXCEEDED; it
    is not run (its row is not computed) and later calls are served as usual."""
    model = FakeAligner(delay_s=0.4)

    async def body(stub):
        first = asyncio.ensure_future(stub.Align(request("first call", 0.5), timeout=10))
        while not model.batches:  # the first forward pass is running
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Align(request("impatient", 0.6), timeout=0.1)
        later = await stub.Align(request("later call", 0.7), timeout=10)
        return await first, info.value, later

    first, error, later = with_stub(servicer_for(model, batch_wait_ms=0.0), body)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert [u.text for u in first.units] == ["first", "call"]
    assert [u.text for u in later.units] == ["later", "call"]
    ran = [item.words for batch in model.batches for item in batch]
    assert ["impatient"] not in ran


def test_max_audio_seconds_flag_lowers_the_model_limit() -> None:
    async def body(stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Align(request("hi", 3.0), timeout=10)
        return info.value

    error = with_stub(servicer_for(FakeAligner(), max_audio_seconds=2.0), body)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 2 s" in error.details()


def test_stats_and_model_info() -> None:
    model = FakeAligner()
    servicer = servicer_for(model, max_batch_size=6)

    async def body(stub):
        await stub.Align(request("a b"), timeout=10)
        return (
            await stub.GetStats(stages_pb2.GetStatsRequest(), timeout=10),
            await stub.GetModelInfo(stages_pb2.GetModelInfoRequest(), timeout=10),
        )

    stats, info = with_stub(servicer, body)
    assert (stats.stage, stats.ready, stats.max_batch_size, stats.total_requests) == ("aligner", True, 6, 1)
    assert (stats.device, stats.dtype) == ("cpu", "float32")
    assert info.model_name == "fake-forced-aligner"
    assert (info.sample_rate, info.timestamp_resolution_ms, info.max_audio_seconds) == (16000, 80.0, 30.0)
    assert (info.device, info.dtype) == ("cpu", "float32")
    assert servicer._load_model.calls == [("/ckpt/fake", "cpu", __import__("torch").float32)]  # type: ignore[attr-defined]


def test_unavailable_until_loaded() -> None:
    async def body(stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetModelInfo(stages_pb2.GetModelInfoRequest(), timeout=10)
        stats = await stub.GetStats(stages_pb2.GetStatsRequest(), timeout=10)
        return info.value, stats

    async def main():
        servicer = servicer_for(FakeAligner())

        def add(server: grpc.aio.Server) -> None:
            stages_pb2_grpc.add_AlignerServicer_to_server(servicer, server)

        # GetStats is what a gateway polls while the stage loads: served before ready.
        config = ServerConfig(stage="aligner", host="127.0.0.1", port=0)
        server, _ = build_server(config, add, [ALIGNER], reject_until_ready=False)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{bound_port(server)}") as channel:
                return await body(stages_pb2_grpc.AlignerStub(channel))
        finally:
            await stopped(server, servicer)

    error, stats = run(main())
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "loading" in error.details()
    assert stats.ready is False


def test_stage_lifecycle_health_reflection_and_drain() -> None:
    """``serve`` as ``python -m aligner_service`` runs it: NOT_SERVING while loading, SERVING
    after, reflection lists the service, and a stop lets the in-flight Align finish."""
    model = FakeAligner(delay_s=0.5)
    servicer = servicer_for(model)
    port = free_port()
    config = FLAGS.server_config(FLAGS.parser().parse_args(["--port", str(port), "--grace-seconds", "5"]))

    async def main() -> tuple[Any, ...]:
        stop = asyncio.Event()
        server_task = asyncio.create_task(
            serve(
                config,
                lambda s: stages_pb2_grpc.add_AlignerServicer_to_server(servicer, s),
                [ALIGNER],
                startup=servicer.load,
                shutdown=servicer.close,
                stop_event=stop,
            )
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(200):
                try:
                    status = await health.Check(health_pb2.HealthCheckRequest(service=ALIGNER), timeout=1)
                    if status.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.05)
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            listed = [
                r
                async for r in reflection.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
            ]
            names = {s.name for s in listed[0].list_services_response.service}
            call = asyncio.ensure_future(
                stages_pb2_grpc.AlignerStub(channel).Align(request("in flight"), timeout=10)
            )
            while not model.batches:
                await asyncio.sleep(0.01)
            stop.set()
            reply = await call
        await server_task
        return status.status, names, reply

    status, names, reply = run(main())
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert ALIGNER in names and "grpc.health.v1.Health" in names
    assert [u.text for u in reply.units] == ["in", "flight"]
    assert servicer.batcher is not None and servicer.batcher._task is None  # close() ran
