"""Failover of stage calls (gateway.stages: failover, pipeline, routing) over fake stage
replicas on loopback: each path on its own, the "frames differ" refusal, the bounds, readiness."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from gateway.config import FailoverPolicy
from gateway.stages.errors import LOCAL_SEND_FAILURE
from gateway.stages.failover import FrameLog, call_with_failover, is_connection_failure, trim_pcm
from gateway.stages.pipeline import StageError, SynthesisPipeline
from gateway.stages.routing import Endpoint, StageClient, tie_readiness
from tests.helpers.fake_stages import (
    NUM_CODEBOOKS,
    FakeDecoder,
    FakeSpeaker,
    FakeTalker,
    expected_signal,
    frame_codes,
    run,
    start_fake,
)
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.config import ServerConfig
from tts_common.serving.health import ServingHealth
from tts_common.serving.server import build_server, keepalive_channel_options, server_options

FRAMES = 24


class Replicas:
    """``n`` fake talkers and ``n`` fake decoders, each its own server, with a StageClient per
    stage over them; :meth:`kill` stops one replica's server (in-flight calls fail)."""

    def __init__(self, n: int = 2, frames: int = FRAMES, delay: float = 0.02) -> None:
        self.talkers = [FakeTalker(frames=frames, delay=delay) for _ in range(n)]
        self.decoders = [FakeDecoder() for _ in range(n)]
        self.servers: dict[int, grpc.aio.Server] = {}

    async def __aenter__(self) -> Replicas:
        targets: dict[str, list[str]] = {"talker": [], "decoder": []}
        for stage, add, fakes in (
            ("talker", stages_pb2_grpc.add_TalkerServicer_to_server, self.talkers),
            ("decoder", stages_pb2_grpc.add_DecoderServicer_to_server, self.decoders),
        ):
            for fake in fakes:
                server, port = await start_fake(add, fake)
                self.servers[id(fake)] = server
                targets[stage].append(f"127.0.0.1:{port}")
        self.talker = StageClient("talker", targets["talker"], stages_pb2_grpc.TalkerStub)
        self.decoder = StageClient("decoder", targets["decoder"], stages_pb2_grpc.DecoderStub)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.talker.close()
        await self.decoder.close()
        for server in self.servers.values():
            await server.stop(0)

    async def kill(self, fake: Any) -> None:
        await self.servers[id(fake)].stop(0)

    def pipeline(self, text: str = "hello", **kwargs: Any) -> SynthesisPipeline:
        kwargs.setdefault("failover", FailoverPolicy(attempts=2, wait_seconds=2.0))
        return SynthesisPipeline(
            self.talker,
            self.decoder,
            stages_pb2.TalkerRequest(request_id="req-1", text=text),
            stages_pb2.DecodeStart(request_id="req-1", first_chunk_frames=2, max_chunk_frames=4),
            **kwargs,
        )


def _busy(fakes: list[Any], attr: str) -> Any:
    """The one replica that has received a call."""
    (busy,) = [f for f in fakes if getattr(f, attr)]
    return busy


async def _audio(pipeline: SynthesisPipeline, after_chunks: int = -1, action: Any = None) -> np.ndarray:
    """The pipeline's whole audio; ``action()`` runs after ``after_chunks`` PCM chunks. Checks
    that the chunks are contiguous (no sample twice, none missing)."""
    pieces: list[np.ndarray] = []
    position = 0
    await pipeline.start()
    async for pcm in pipeline.pcm_chunks():
        assert pcm.start_sample == position
        assert pcm.num_samples == len(pcm.samples) // 4
        position += pcm.num_samples
        pieces.append(np.frombuffer(pcm.samples, dtype="<f4"))
        if len(pieces) == after_chunks:
            await action()
    return np.concatenate(pieces)


def _failovers(peer: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "qwen3tts_failovers_total", {"stage": "gateway", "peer": peer, "result": result}
    )
    return value or 0.0


# ---------------------------------------------------------------------------------------------
# Each failover path


def test_decoder_lost_mid_stream_is_replayed_on_another_replica() -> None:
    async def main() -> None:
        before = _failovers("decoder", "ok")
        async with Replicas() as stack, stack.pipeline() as pipeline:

            async def kill() -> None:
                await stack.kill(_busy(stack.decoders, "starts"))

            audio = await _audio(pipeline, after_chunks=2, action=kill)
            # Exact streaming: the replayed decode equals the undisturbed one, sample for sample.
            np.testing.assert_array_equal(audio, expected_signal(FRAMES))
            assert pipeline.failovers == {"talker": 0, "decoder": 1}
            assert all(len(d.starts) == 1 for d in stack.decoders)
            assert stack.decoders[0].starts[0] == stack.decoders[1].starts[0]
            assert pipeline.talker_done is not None and pipeline.talker_done.frames == FRAMES
        assert _failovers("decoder", "ok") == before + 1

    run(main())


def test_talker_lost_mid_stream_regenerates_checks_and_skips() -> None:
    async def main() -> None:
        async with Replicas() as stack, stack.pipeline() as pipeline:

            async def kill() -> None:
                await stack.kill(_busy(stack.talkers, "requests"))

            audio = await _audio(pipeline, after_chunks=3, action=kill)
            np.testing.assert_array_equal(audio, expected_signal(FRAMES))
            assert pipeline.failovers == {"talker": 1, "decoder": 0}
            first, second = (t.requests for t in stack.talkers)
            assert first == second  # the same prompt and seed went to the replacement
            assert [len(d.starts) for d in stack.decoders].count(1) == 1  # the decoder call lived on

    run(main())


def test_talker_failover_replays_the_streamed_text_sent_so_far() -> None:
    """A ``text_open`` request's replacement talker gets the request and then every text message
    the lost one had, before the text still to come: streamed text gives the same frames however
    it arrives, so the regenerated frames match and the audio goes on without a seam."""

    async def main() -> None:
        later: asyncio.Queue[str | None] = asyncio.Queue()

        async def text() -> Any:
            for piece in ("hel", "lo wor"):
                yield stages_pb2.TalkerClientMessage(append_text=stages_pb2.AppendText(text=piece))
            while (piece := await later.get()) is not None:
                yield stages_pb2.TalkerClientMessage(append_text=stages_pb2.AppendText(text=piece))
            yield stages_pb2.TalkerClientMessage(end_text=stages_pb2.EndText())

        async with Replicas() as stack:
            pipeline = SynthesisPipeline(
                stack.talker,
                stack.decoder,
                stages_pb2.TalkerRequest(request_id="req-1", text_open=True),
                stages_pb2.DecodeStart(request_id="req-1", first_chunk_frames=2, max_chunk_frames=4),
                failover=FailoverPolicy(attempts=2, wait_seconds=2.0),
                text=text(),
            )
            async with pipeline:

                async def kill_then_finish_the_text() -> None:
                    lost = _busy(stack.talkers, "requests")
                    await stack.kill(lost)
                    later.put_nowait("ld")
                    later.put_nowait(None)

                audio = await _audio(pipeline, after_chunks=3, action=kill_then_finish_the_text)
            np.testing.assert_array_equal(audio, expected_signal(FRAMES))
            assert pipeline.failovers == {"talker": 1, "decoder": 0}
            lost, replacement = sorted(stack.talkers, key=lambda t: "req-1" in t.texts)
            assert lost.text_messages["req-1"] == ["hel", "lo wor"]
            assert replacement.text_messages["req-1"] == ["hel", "lo wor", "ld", "<end>"]
            assert replacement.texts["req-1"] == "hello world"

    run(main())


def test_talker_failover_refuses_to_splice_different_frames() -> None:
    async def main() -> None:
        before = _failovers("talker", "refused")
        async with Replicas() as stack:
            pipeline = stack.pipeline()
            async with pipeline:

                async def kill() -> None:
                    busy = _busy(stack.talkers, "requests")
                    other = next(t for t in stack.talkers if t is not busy)
                    other.codes = lambda f: [(c + 7) % 2048 for c in frame_codes(f)]
                    await stack.kill(busy)

                with pytest.raises(StageError) as info:
                    await _audio(pipeline, after_chunks=2, action=kill)
            assert info.value.stage == "talker"
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert "different codec frames" in info.value.details  # for the log
            assert "frame 0 differs" in info.value.details
            assert "the talker stage is unavailable" in str(info.value)  # for the client
        assert _failovers("talker", "refused") == before + 1

    run(main())


def test_decoder_silent_after_the_end_is_replayed_elsewhere() -> None:
    async def main() -> None:
        async with Replicas(frames=8, delay=0.005) as stack:
            for decoder in stack.decoders:
                decoder.hang_at_end = True
            pipeline = stack.pipeline(drain_timeout=0.3)
            async with pipeline:

                async def unhang_others() -> None:
                    busy = _busy(stack.decoders, "starts")
                    for decoder in stack.decoders:
                        decoder.hang_at_end = decoder is busy

                audio = await _audio(pipeline, after_chunks=1, action=unhang_others)
            np.testing.assert_array_equal(audio, expected_signal(8))
            assert pipeline.failovers["decoder"] == 1

    run(main())


def test_no_replica_left_ends_with_unavailable_naming_the_stage() -> None:
    async def main() -> None:
        before = _failovers("decoder", "exhausted")
        async with Replicas() as stack:
            pipeline = stack.pipeline(failover=FailoverPolicy(attempts=3, wait_seconds=0.3))
            async with pipeline:

                async def kill_all() -> None:
                    for decoder in stack.decoders:
                        await stack.kill(decoder)

                with pytest.raises(StageError) as info:
                    await _audio(pipeline, after_chunks=1, action=kill_all)
            assert info.value.stage == "decoder"
            assert info.value.code is grpc.StatusCode.UNAVAILABLE
            assert "the decoder stage is unavailable" in str(info.value)
        assert _failovers("decoder", "exhausted") == before + 1

    run(main())


def test_failover_disabled_and_bare_stubs_end_the_stream() -> None:
    async def main() -> None:
        async with Replicas() as stack:
            for policy in (FailoverPolicy(attempts=0), None):
                for talker in stack.talkers:
                    talker.requests.clear()
                if policy is None:  # the pre-failover interface: one stub per stage
                    pipeline = SynthesisPipeline(
                        stack.talker.endpoints[0].stub,
                        stack.decoder.endpoints[0].stub,
                        stages_pb2.TalkerRequest(request_id="req-2", text="hi"),
                        stages_pb2.DecodeStart(request_id="req-2"),
                    )
                else:
                    pipeline = stack.pipeline(failover=policy)
                async with pipeline:

                    async def kill() -> None:
                        await stack.kill(_busy(stack.talkers, "requests"))

                    with pytest.raises(StageError) as info:
                        await _audio(pipeline, after_chunks=1, action=kill)
                assert info.value.stage == "talker" and info.value.code is grpc.StatusCode.UNAVAILABLE
                assert pipeline.failovers == {"talker": 0, "decoder": 0}

    run(main())


def test_bare_stubs_still_synthesize() -> None:
    async def main() -> None:
        async with Replicas(n=1, frames=6, delay=0.001) as stack:
            pipeline = SynthesisPipeline(
                stack.talker.endpoints[0].stub,
                stack.decoder.endpoints[0].stub,
                stages_pb2.TalkerRequest(request_id="req-3", text="hi"),
                stages_pb2.DecodeStart(request_id="req-3"),
            )
            async with pipeline:
                np.testing.assert_array_equal(await _audio(pipeline), expected_signal(6))

    run(main())


def test_request_errors_are_not_failed_over() -> None:
    async def main() -> None:
        async with Replicas() as stack, stack.pipeline(text="talker-reject") as pipeline:
            with pytest.raises(StageError) as info:
                await _audio(pipeline)
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert sum(len(t.requests) for t in stack.talkers) == 1

    run(main())


def test_speaker_call_is_retried_on_another_replica() -> None:
    async def main() -> None:
        speakers = [FakeSpeaker(), FakeSpeaker()]
        servers = [await start_fake(stages_pb2_grpc.add_SpeakerServicer_to_server, s) for s in speakers]
        client = StageClient(
            "speaker", [f"127.0.0.1:{port}" for _, port in servers], stages_pb2_grpc.SpeakerStub
        )
        await servers[0][0].stop(0)  # the first replica is gone
        request = stages_pb2.ReferenceAudio(request_id="r", audio=b"abc")
        targets: list[str] = []

        async def call(endpoint: Endpoint[stages_pb2_grpc.SpeakerStub]) -> stages_pb2.ReferenceEmbedding:
            targets.append(endpoint.target)
            reply: stages_pb2.ReferenceEmbedding = await endpoint.stub.EmbedReference(request, timeout=5)
            return reply

        try:
            for _ in range(2):  # whichever replica the round-robin picks first
                reply = await call_with_failover(client, FailoverPolicy(wait_seconds=1.0), "r", call)
                assert reply.audio_sha256
            assert len(speakers[1].requests) == 2 and not speakers[0].requests
            assert client.endpoints[0].healthy is False
            with pytest.raises(grpc.aio.AioRpcError) as info:  # a request error is not retried
                await call_with_failover(
                    client,
                    FailoverPolicy(),
                    "r",
                    lambda e: e.stub.EmbedReference(
                        stages_pb2.ReferenceAudio(audio=b"RIFF speaker-reject"), timeout=5
                    ),
                )
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert len(speakers[1].requests) == 3
        finally:
            await client.close()
            await servers[1][0].stop(0)

    run(main())


# ---------------------------------------------------------------------------------------------
# Health: readiness follows the stages; a draining replica gets no new streams


async def _wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_readiness_flips_with_stage_reachability() -> None:
    async def main() -> None:
        talker = FakeTalker()
        server, port = await start_fake(stages_pb2_grpc.add_TalkerServicer_to_server, talker)
        decoder_server, decoder_port = await start_fake(
            stages_pb2_grpc.add_DecoderServicer_to_server, FakeDecoder()
        )
        options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 200)]
        clients = [
            StageClient("talker", [f"127.0.0.1:{port}"], stages_pb2_grpc.TalkerStub, options=options),
            StageClient(
                "decoder", [f"127.0.0.1:{decoder_port}"], stages_pb2_grpc.DecoderStub, options=options
            ),
        ]
        health = ServingHealth(["svc"], ready=True)
        tie_readiness(health, clients)
        assert health.status("svc") == ServingHealth.NOT_SERVING  # nothing checked yet
        try:
            for client in clients:
                client.start_health_checks(0.05, 0.5)
            await _wait_for(lambda: health.status("svc") == ServingHealth.SERVING)
            await server.stop(0)
            await _wait_for(lambda: health.status("svc") == ServingHealth.NOT_SERVING)
            assert health.unmet_dependencies == ("talker stage",)
            assert health.status("") == ServingHealth.SERVING  # liveness is not readiness
            server, _ = await start_fake(stages_pb2_grpc.add_TalkerServicer_to_server, talker, port)
            await _wait_for(lambda: health.status("svc") == ServingHealth.SERVING)
        finally:
            for client in clients:
                await client.close()
            await server.stop(0)
            await decoder_server.stop(0)

    run(main())


def test_a_draining_replica_gets_no_new_streams() -> None:
    async def main() -> None:
        servers, healths, fakes = [], [], []
        for _ in range(2):
            fake = FakeDecoder()

            def add(server: grpc.aio.Server, fake: FakeDecoder = fake) -> None:
                stages_pb2_grpc.add_DecoderServicer_to_server(fake, server)

            server, health = build_server(ServerConfig(host="127.0.0.1", port=0), add, ["decoder"])
            await server.start()
            health.mark_ready()
            servers.append(server)
            healths.append(health)
            fakes.append(fake)
        from tts_common.serving.server import bound_port

        client = StageClient(
            "decoder",
            [f"127.0.0.1:{bound_port(s)}" for s in servers],
            stages_pb2_grpc.DecoderStub,
            health_service="decoder",
        )
        try:
            client.start_health_checks(0.05, 0.5)
            await client.first_checks_done(5)
            assert all(e.healthy for e in client.endpoints)
            healths[0].enter_graceful_shutdown()  # SIGTERM: drain
            assert healths[0].status("decoder") == health_pb2.HealthCheckResponse.NOT_SERVING
            await _wait_for(lambda: client.endpoints[0].healthy is False)
            assert client.reachable
            picked = {client.acquire().target for _ in range(4)}
            assert picked == {client.endpoints[1].target}
        finally:
            await client.close()
            for server in servers:
                await server.stop(0)

    run(main())


def test_keepalive_notices_a_frozen_replica_within_5_s() -> None:
    """A SIGSTOPped replica keeps its connections open: only the keepalive pings of the stage
    channels (the gateway's defaults: 2 s + 2 s) end its calls, so they can fail over."""
    fakes = Path(__file__).resolve().parents[2] / "helpers" / "fake_stages.py"
    proc = subprocess.Popen(
        [sys.executable, str(fakes), "talker", "custom_voice", "100000", "0.02"],
        stdout=subprocess.PIPE,
        text=True,
    )

    async def main() -> float:
        assert proc.stdout is not None
        port = int(await asyncio.to_thread(proc.stdout.readline))
        options = keepalive_channel_options(2.0, 2.0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = stages_pb2_grpc.TalkerStub(channel).Generate()
            await call.write(stages_pb2.TalkerClientMessage(request=stages_pb2.TalkerRequest(request_id="k")))
            assert (await call.read()).WhichOneof("message") == "chunk"
            os.kill(proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:  # frames already in flight arrive, then nothing
                    await call.read()
            assert is_connection_failure(info.value.code())
            return time.monotonic() - frozen

    try:
        assert run(main(), timeout=30) < 5.0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)


# ---------------------------------------------------------------------------------------------
# Pieces: statuses, options, the frame log, trimming replayed PCM


def test_connection_failures_are_unavailable_and_cancelled_only() -> None:
    for code in grpc.StatusCode:
        assert is_connection_failure(code) == (
            code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        )


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "debug")


def test_a_message_grpc_could_not_send_fails_over_and_a_stages_own_status_does_not() -> None:
    """grpc's asyncio client reports a message it could not send on a broken connection (the
    replica died mid-stream) as INTERNAL "Internal error from Core", on that write and on every
    later read of the call: a connection failure."""
    broken = StageError.from_rpc_error("talker", _rpc_error(grpc.StatusCode.INTERNAL, LOCAL_SEND_FAILURE))
    assert broken.connection_failure and broken.code is grpc.StatusCode.UNAVAILABLE
    assert "the talker stage is unavailable" in str(broken)
    for code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT):
        verdict = StageError.from_rpc_error("talker", _rpc_error(code, "the stage's own words"))
        assert not verdict.connection_failure and verdict.code is code
        assert verdict.details == "the stage's own words"


def test_keepalive_and_connection_age_options() -> None:
    assert keepalive_channel_options(0, 2) == []
    options = dict(keepalive_channel_options(2, 1.5))
    assert options["grpc.keepalive_time_ms"] == 2000
    assert options["grpc.keepalive_timeout_ms"] == 1500
    assert options["grpc.keepalive_permit_without_calls"] == 1
    server = dict(server_options(ServerConfig(max_connection_age_seconds=60)))
    assert server["grpc.max_connection_age_ms"] == 60000
    assert server["grpc.max_connection_age_grace_ms"] == 2**31 - 1  # in-flight streams finish
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert "grpc.max_connection_age_ms" not in dict(
        server_options(ServerConfig(max_connection_age_seconds=0))
    )


def _codes(first: int, n: int, shift: int = 0) -> stages_pb2.Codes:
    values = [c + shift for f in range(first, first + n) for c in frame_codes(f)]
    return stages_pb2.Codes(num_frames=n, num_codebooks=NUM_CODEBOOKS, values=values)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    max_frames=st.integers(1, 60),
    per_chunk=st.integers(1, 11),
)
def test_frame_log_keeps_replays_and_compares_exactly(
    sizes: list[int], max_frames: int, per_chunk: int
) -> None:
    log = FrameLog(max_frames)
    start = 0
    for n in sizes:
        log.append(_codes(start, n))
        start += n
    assert log.frames == start
    assert log.complete == (start <= max_frames)
    if not log.complete:
        with pytest.raises(ValueError):
            list(log.chunks())
        assert log.first_mismatch(0, _codes(0, 1)) == 0  # cannot vouch for anything: refuse
        return
    replay = list(log.chunks(per_chunk))
    assert [c.start_frame for c in replay] == list(range(0, start, per_chunk))
    values = [v for c in replay for v in c.codes.values]
    assert values == list(_codes(0, start).values)
    for first in range(start):
        assert log.first_mismatch(first, _codes(first, start - first + 3)) is None
        differs = _codes(first, start - first)
        differs.values[-1] += 1  # only the last logged frame differs
        assert log.first_mismatch(first, differs) == start - 1


@settings(max_examples=60, deadline=None)
@given(
    frames=st.integers(1, 40),
    old=st.lists(st.integers(1, 8), min_size=1, max_size=10),
    new=st.lists(st.integers(1, 8), min_size=1, max_size=10),
    spf=st.sampled_from([1, 3, 1920]),
    data=st.data(),
)
def test_trim_pcm_joins_a_replay_to_what_was_delivered(
    frames: int, old: list[int], new: list[int], spf: int, data: st.DataObject
) -> None:
    signal = np.arange(frames * spf, dtype=np.float32)

    def chunking(sizes: list[int]) -> list[stages_pb2.PcmChunk]:
        chunks, f, i = [], 0, 0
        while f < frames:
            n = min(sizes[i % len(sizes)], frames - f)
            piece = signal[f * spf : (f + n) * spf]
            chunks.append(
                stages_pb2.PcmChunk(
                    samples=piece.astype("<f4").tobytes(),
                    start_sample=f * spf,
                    num_samples=piece.size,
                    start_frame=f,
                    num_frames=n,
                )
            )
            f, i = f + n, i + 1
        return chunks

    first = chunking(old)
    kept = first[: data.draw(st.integers(0, len(first)))]  # what the client got before the loss
    delivered = sum(c.num_samples for c in kept)
    out = [np.frombuffer(c.samples, dtype="<f4") for c in kept]
    position = 0
    for chunk in chunking(new):
        piece = trim_pcm(chunk, position, delivered)
        position += chunk.num_samples
        if piece is not None:
            assert piece.start_sample == delivered and piece.num_samples * 4 == len(piece.samples)
            assert piece.start_frame * spf == piece.start_sample
            delivered += piece.num_samples
            out.append(np.frombuffer(piece.samples, dtype="<f4"))
    np.testing.assert_array_equal(np.concatenate(out) if out else np.zeros(0, np.float32), signal)
