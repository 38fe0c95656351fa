"""Fake stage servers (talker, decoder, speaker) and an in-process gateway harness for the
gateway tests (their own sanity test: ``tests/unit/gateway/test_fakes.py``).

The fakes are deterministic: the talker emits ``frames`` frames whose codes depend only on the
frame index, the decoder turns each frame into 1920 samples of a tone whose amplitude depends on
the frame's first code (:func:`expected_signal` gives the whole utterance), the speaker returns an
x-vector derived from the audio bytes and 5 frames of reference codes. The talker can serve a
checkpoint's tokenizer files (``tokenizer_dir``), take a different frame count for given texts
(``frames_by_text``) and counts its concurrent generations; the decoder can turn silent from a
given frame on (``silent_from_frame``).

Run as a script (``python tests/helpers/fake_stages.py talker MODEL_TYPE FRAMES DELAY [PORT]``
or ``... decoder [PORT]``) it serves a fake talker (decoder) on loopback (a free port by default)
and prints the port: the process tests start, SIGKILL and wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np

if __name__ == "__main__":  # script mode: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

T = TypeVar("T")
FAKE_CODEC = "f" * 64
"""The speech tokenizer fingerprint the fake talkers and decoders report (they all match)."""
SAMPLES_PER_FRAME = 1920
NUM_CODEBOOKS = 16
EMBEDDING_DIM = 8
REF_FRAMES = 5


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    """Run a test coroutine with a hard timeout (no pytest-asyncio needed)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---------------------------------------------------------------------------------------------
# Deterministic signal


def frame_codes(frame: int) -> list[int]:
    return [(frame * 31 + q * 3 + 1) % 2048 for q in range(NUM_CODEBOOKS)]


def frame_audio(frame: int, code0: int) -> np.ndarray:
    """The fake decoder's output for generated frame ``frame`` with first code ``code0``."""
    t = (frame * SAMPLES_PER_FRAME + np.arange(SAMPLES_PER_FRAME)) / 24000.0
    amp = 0.1 + 0.08 * (code0 % 5)
    return (amp * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


def expected_signal(frames: int) -> np.ndarray:
    """The whole 24 kHz float32 utterance of ``frames`` fake frames."""
    if frames == 0:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([frame_audio(f, frame_codes(f)[0]) for f in range(frames)])


# ---------------------------------------------------------------------------------------------
# Fake stages


def model_info(model_type: str) -> stages_pb2.TalkerInfo:
    speakers = (
        [
            tts_pb2.PresetSpeaker(name="vivian"),
            tts_pb2.PresetSpeaker(name="ryan"),
            tts_pb2.PresetSpeaker(name="eric", dialect="sichuan_dialect"),
        ]
        if model_type == "custom_voice"
        else []
    )
    return stages_pb2.TalkerInfo(
        model=tts_pb2.ModelInfo(
            model_type=model_type,
            model_size="0b6",
            model_name=f"fake-{model_type}",
            sample_rate=24000,
            frame_rate=12.5,
            num_codebooks=NUM_CODEBOOKS,
            speakers=speakers,
            languages=["auto", "chinese", "english"],
            instruct_supported=model_type == "voice_design",
            voice_clone_supported=model_type == "base",
            default_sampling=tts_pb2.SamplingOptions(
                do_sample=True,
                temperature=0.9,
                top_k=50,
                top_p=1.0,
                repetition_penalty=1.05,
                subtalker_do_sample=True,
                subtalker_temperature=0.9,
                subtalker_top_k=50,
                subtalker_top_p=1.0,
                max_new_tokens=2048,
            ),
            dtype="float32",
        ),
        max_batch_size=4,
        max_seq_len=4096,
        speaker_embedding_dim=EMBEDDING_DIM if model_type == "base" else 0,
        device="cpu",
        dtype="float32",
        speech_tokenizer=FAKE_CODEC,
    )


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class FakeTalker(stages_pb2_grpc.TalkerServicer):
    """Emits ``frames`` frames ``delay`` seconds apart; honours Cancel and call cancellation.
    Text "talker-reject" (the request's, or an AppendText holding it) ends the call with
    INVALID_ARGUMENT, the latter at once (or once :attr:`hold_reject` is set), while the client
    may still be writing text."""

    def __init__(
        self,
        model_type: str = "custom_voice",
        frames: int = 6,
        delay: float = 0.005,
        tokenizer_dir: Path | None = None,
    ) -> None:
        self.info = model_info(model_type)
        self.frames = frames
        self.delay = delay
        self.tokenizer_dir = tokenizer_dir
        """Serve this checkpoint's tokenizer files (GetTokenizer); None: UNIMPLEMENTED."""
        self.frames_by_text: dict[str, int] = {}
        """Frames for requests with these texts (instead of ``frames``)."""
        self.active = 0
        """Generations running now."""
        self.max_active = 0
        """Most generations that ran at once."""
        self.started_at: list[float] = []
        self.finished_at: list[float] = []
        """loop.time() when each Generate call started / ended (in order of the events)."""
        self.requests: list[stages_pb2.TalkerRequest] = []
        self.texts: dict[str, str] = {}
        """Request id -> the whole text of a ``text_open`` request, once its EndText arrived."""
        self.text_messages: dict[str, list[str]] = {}
        """Request id -> the text messages of a ``text_open`` request as received ("<end>" last)."""
        self.cancel_messages = 0
        self.cancelled_calls = 0
        self.stop_exceptions: list[str] = []
        self.rpc_cancelled = 0
        """Generate calls that ended cancelled (by the caller or its deadline)."""
        self.model_info_calls = 0
        self.stopped = asyncio.Event()
        """Set when a generation ended because of Cancel or call cancellation."""
        self.started = asyncio.Event()
        self.codes: Callable[[int], list[int]] = frame_codes
        """The codes of frame f (another function = a talker serving a different checkpoint)."""
        self.hold_reject: asyncio.Event | None = None
        """If given, an AppendText "talker-reject" ends the call only once this is set."""

    async def GetModelInfo(
        self,
        request: stages_pb2.GetModelInfoRequest,
        context: grpc.aio.ServicerContext,
    ) -> stages_pb2.TalkerInfo:
        self.model_info_calls += 1
        return self.info

    async def GetTokenizer(
        self,
        request: stages_pb2.GetTokenizerRequest,
        context: grpc.aio.ServicerContext,
    ) -> stages_pb2.TokenizerFiles:
        if self.tokenizer_dir is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "fake talker has no tokenizer")
        from tts_common.text.tokenizer import read_tokenizer_files

        return stages_pb2.TokenizerFiles(files=read_tokenizer_files(self.tokenizer_dir))

    async def Generate(
        self,
        request_iterator: AsyncIterator[stages_pb2.TalkerClientMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stages_pb2.TalkerServerMessage]:
        first = await anext(aiter(request_iterator))
        request = first.request
        self.requests.append(request)

        def on_done(ctx: grpc.aio.ServicerContext) -> None:
            # grpc.aio may leave a handler's generator suspended (closed only when garbage
            # collected) if the cancellation lands while it sends a message; the RPC's done
            # callback is the reliable signal that the caller cancelled the call.
            if ctx.cancelled():
                self.rpc_cancelled += 1
                self.stopped.set()

        context.add_done_callback(on_done)
        if request.text == "talker-reject":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fake talker rejects this")
        cancel = asyncio.Event()
        text = [request.text]
        text_arrived = asyncio.Event()
        text_ended = asyncio.Event()
        rejected = asyncio.Event()
        if not request.text_open:
            text_ended.set()
        if request.text or not request.text_open:
            text_arrived.set()
        received = self.text_messages.setdefault(request.request_id, [])

        async def reject() -> None:
            if self.hold_reject is not None:
                await self.hold_reject.wait()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fake talker rejects this")

        async def watch() -> None:
            async for message in request_iterator:
                kind = message.WhichOneof("message")
                if kind == "cancel":
                    self.cancel_messages += 1
                    cancel.set()
                    return
                if kind == "append_text":
                    text.append(message.append_text.text)
                    received.append(message.append_text.text)
                    text_arrived.set()
                    if "talker-reject" in message.append_text.text:
                        rejected.set()
                        return
                elif kind == "end_text":
                    received.append("<end>")
                    self.texts[request.request_id] = "".join(text)
                    text_arrived.set()
                    text_ended.set()

        watcher = asyncio.create_task(watch())
        n, reason = self.frames_by_text.get(request.text, self.frames), tts_pb2.FINISH_REASON_EOS
        if request.sampling.HasField("max_new_tokens") and request.sampling.max_new_tokens - 1 < n:
            n, reason = request.sampling.max_new_tokens - 1, tts_pb2.FINISH_REASON_LENGTH
        # Like the real talker: a text_open request starts once it has text (waits on Cancel too).
        await _first_of(text_arrived, cancel)
        if rejected.is_set():
            await reject()
        self.started.set()
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.started_at.append(asyncio.get_running_loop().time())
        try:
            for f in range(n + 1):
                if f == n:  # a text_open request ends only after its text (it waits in its slot)
                    await _first_of(text_ended, cancel, rejected)
                    if not (cancel.is_set() or rejected.is_set()):
                        break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(rejected.wait(), self.delay)
                if rejected.is_set():
                    await reject()
                if cancel.is_set():
                    self.stopped.set()
                    yield stages_pb2.TalkerServerMessage(
                        done=stages_pb2.TalkerDone(frames=f, finish_reason=tts_pb2.FINISH_REASON_CANCELLED)
                    )
                    return
                yield stages_pb2.TalkerServerMessage(
                    chunk=stages_pb2.CodecChunk(
                        start_frame=f,
                        codes=stages_pb2.Codes(
                            num_frames=1, num_codebooks=NUM_CODEBOOKS, values=self.codes(f)
                        ),
                    )
                )
            yield stages_pb2.TalkerServerMessage(
                done=stages_pb2.TalkerDone(frames=n, finish_reason=reason, queue_ms=1.5)
            )
        except grpc.aio.AbortError:
            raise
        except BaseException as exc:  # CancelledError, or GeneratorExit when grpc closes us
            self.cancelled_calls += 1
            self.stop_exceptions.append(type(exc).__name__)
            self.stopped.set()
            raise
        finally:
            self.active -= 1
            self.finished_at.append(asyncio.get_running_loop().time())
            watcher.cancel()

    async def GetStats(
        self,
        request: stages_pb2.GetStatsRequest,
        context: grpc.aio.ServicerContext,
    ) -> stages_pb2.StageStats:
        return stages_pb2.StageStats(stage="talker", ready=True)


class FakeDecoder(stages_pb2_grpc.DecoderServicer):
    """Frame f -> :func:`frame_audio`; chunks of first_chunk_frames, doubling up to max."""

    def __init__(self, speech_tokenizer: str = FAKE_CODEC) -> None:
        self.speech_tokenizer = speech_tokenizer
        """The fingerprint GetModelInfo reports."""
        self.starts: list[stages_pb2.DecodeStart] = []
        self.cancelled_calls = 0
        """Calls that ended without DecodeEnd (cancelled by the client or failed)."""
        self.chunk_frames: list[int] = []
        self.hang_at_end = False
        """Simulate a stuck decoder: never answer after DecodeEnd."""
        self.silent_from_frame: int | None = None
        """Output digital silence for every generated frame from this one on."""
        self.first_pcm_at: list[float] = []
        """loop.time() of each Decode call's first PCM chunk (in the order they were sent)."""

    async def GetModelInfo(
        self, request: stages_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.DecoderInfo:
        return stages_pb2.DecoderInfo(speech_tokenizer=self.speech_tokenizer, sample_rate=24000)

    async def Decode(
        self,
        request_iterator: AsyncIterator[stages_pb2.DecoderClientMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stages_pb2.DecoderServerMessage]:
        iterator = aiter(request_iterator)
        start = (await anext(iterator)).start
        self.starts.append(start)
        size = start.first_chunk_frames or 2
        largest = start.max_chunk_frames or 25
        pending: list[tuple[int, int]] = []  # (frame index, code0)
        next_frame = 0
        out_frame = 0

        def audio_of(frame: int, code0: int) -> np.ndarray:
            if self.silent_from_frame is not None and frame >= self.silent_from_frame:
                return np.zeros(SAMPLES_PER_FRAME, dtype=np.float32)
            return frame_audio(frame, code0)

        def pcm(frames: list[tuple[int, int]]) -> stages_pb2.DecoderServerMessage:
            audio = np.concatenate([audio_of(f, c) for f, c in frames])
            if frames[0][0] == 0:
                self.first_pcm_at.append(asyncio.get_running_loop().time())
            self.chunk_frames.append(len(frames))
            return stages_pb2.DecoderServerMessage(
                pcm=stages_pb2.PcmChunk(
                    samples=audio.astype("<f4").tobytes(),
                    sample_rate=24000,
                    start_sample=frames[0][0] * SAMPLES_PER_FRAME,
                    num_samples=audio.size,
                    start_frame=frames[0][0],
                    num_frames=len(frames),
                )
            )

        ended = False
        try:
            async for message in iterator:
                kind = message.WhichOneof("message")
                if kind == "chunk":
                    codes = message.chunk.codes
                    for i in range(codes.num_frames):
                        pending.append((next_frame, codes.values[i * codes.num_codebooks]))
                        next_frame += 1
                    while len(pending) >= size:
                        yield pcm(pending[:size])
                        out_frame += size
                        pending = pending[size:]
                        size = min(size * 2, largest)
                elif kind == "end":
                    ended = True
                    break
            if not ended:  # the client went away
                self.cancelled_calls += 1
                return
            if self.hang_at_end:
                await asyncio.Event().wait()
            if pending:
                yield pcm(pending)
            yield stages_pb2.DecoderServerMessage(
                done=stages_pb2.DecodeDone(frames=next_frame, num_samples=next_frame * SAMPLES_PER_FRAME)
            )
        except asyncio.CancelledError:
            self.cancelled_calls += 1
            raise


class FakeSpeaker(stages_pb2_grpc.SpeakerServicer):
    """x-vector from the audio digest; 5 reference frames when asked for codes."""

    def __init__(self, dim: int = EMBEDDING_DIM) -> None:
        self.dim = dim
        self.requests: list[stages_pb2.ReferenceAudio] = []

    async def EmbedReference(
        self,
        request: stages_pb2.ReferenceAudio,
        context: grpc.aio.ServicerContext,
    ) -> stages_pb2.ReferenceEmbedding:
        self.requests.append(request)
        if request.audio.startswith(b"RIFF") and b"speaker-reject" in request.audio:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fake speaker rejects this")
        digest = hashlib.sha256(request.audio).digest()
        result = stages_pb2.ReferenceEmbedding(
            speaker_embedding=[b / 255.0 for b in digest[: self.dim]],
            audio_seconds=1.0,
            audio_sha256=digest.hex(),
        )
        if request.want_codes:
            result.ref_codes.CopyFrom(ref_codes())
        return result


def ref_codes() -> stages_pb2.Codes:
    return stages_pb2.Codes(
        num_frames=REF_FRAMES,
        num_codebooks=NUM_CODEBOOKS,
        values=[(900 + i) % 2048 for i in range(REF_FRAMES * NUM_CODEBOOKS)],
    )


async def start_fake(add: Any, servicer: Any, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    add(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


# ---------------------------------------------------------------------------------------------
# Gateway harness


class Harness:
    """Fake stages + the real gateway (servicer, interceptors) on loopback, plus a client.

    One model by default (``model_type``: its fake talker is :attr:`talker`, its speaker
    :attr:`speaker`); with ``models`` (name -> model type) one fake talker each
    (:attr:`talkers`), a fake speaker each for the base ones (:attr:`speakers`), all behind the
    one fake decoder, served by name (the first is the default)."""

    def __init__(
        self,
        model_type: str = "custom_voice",
        *,
        speaker: bool = True,
        talker_target: str | None = None,
        frames: int = 6,
        delay: float = 0.005,
        client_credentials: grpc.ChannelCredentials | None = None,
        http: bool = False,
        tokenizer_dir: Path | None = None,
        models: dict[str, str] | None = None,
        **config: Any,
    ) -> None:
        """``http``: also serve the HTTP API (``http_url``) on a free loopback port."""
        self.client_credentials = client_credentials
        self.with_http = http
        self.http_server: Any = None
        self.http_url = ""
        self.cleanups: list[Any] = []
        """Coroutine functions awaited on exit, before the servers stop (e.g. closing clients)."""
        self.model_type = model_type
        self.with_speaker = speaker
        self.talker_target = talker_target
        self.model_types = models or {}
        self.talkers = {
            name: FakeTalker(kind, frames, delay, tokenizer_dir) for name, kind in self.model_types.items()
        }
        self.speakers = {name: FakeSpeaker() for name, kind in self.model_types.items() if kind == "base"}
        self.talker = FakeTalker(model_type, frames, delay, tokenizer_dir)
        self.decoder = FakeDecoder()
        self.speaker = FakeSpeaker()
        self.config_overrides = config
        self.fake_servers: list[grpc.aio.Server] = []

    async def _serve(self, add: Any, fake: Any) -> str:
        server, port = await start_fake(add, fake)
        self.fake_servers.append(server)
        return f"127.0.0.1:{port}"

    async def __aenter__(self) -> Harness:
        from gateway.config import GatewayConfig, ModelRoute
        from gateway.core import Gateway
        from gateway.transports.grpc_api import GatewayServicer, build_gateway_server
        from tts_common.serving.config import ServerConfig
        from tts_common.serving.server import bound_port

        add_talker = stages_pb2_grpc.add_TalkerServicer_to_server
        add_speaker = stages_pb2_grpc.add_SpeakerServicer_to_server
        self.decoder_server_target = await self._serve(
            stages_pb2_grpc.add_DecoderServicer_to_server, self.decoder
        )
        self.decoder_server = self.fake_servers[-1]
        stages: dict[str, Any] = {}
        if self.model_types:
            routes = []
            for name, talker in self.talkers.items():
                speakers = (
                    (await self._serve(add_speaker, self.speakers[name]),) if name in self.speakers else ()
                )
                routes.append(ModelRoute(name, (await self._serve(add_talker, talker),), speakers))
            stages["models"] = tuple(routes)
        else:
            if self.talker_target is not None:
                talker_target = self.talker_target
            else:
                talker_target = await self._serve(add_talker, self.talker)
                self.talker_server = self.fake_servers[-1]
            speaker_target = await self._serve(add_speaker, self.speaker)
            self.speaker_server = self.fake_servers[-1]
            stages["talker_targets"] = (talker_target,)
            stages["speaker_targets"] = (speaker_target,) if self.with_speaker else ()
        self.config = GatewayConfig(
            decoder_targets=(self.decoder_server_target,), **stages, **self.config_overrides
        )
        self.gateway = Gateway.from_config(self.config)
        self.servicer = GatewayServicer(self.gateway)
        self.server, self.health = build_gateway_server(
            ServerConfig(stage="gateway", host="127.0.0.1", port=0), self.servicer, self.config
        )
        await self.server.start()
        if self.with_http:
            from gateway.transports.http import HttpServer

            self.http_server = HttpServer(self.gateway, self.config, "127.0.0.1", 0)
            await self.http_server.start(self.health)
            self.http_url = f"{self.http_server.scheme}://127.0.0.1:{self.http_server.port}"
        await self.gateway.start()
        self.health.mark_ready()
        self.port = bound_port(self.server)
        if self.client_credentials is None:
            self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        else:
            self.channel = grpc.aio.secure_channel(f"localhost:{self.port}", self.client_credentials)
        self.stub = tts_pb2_grpc.TextToSpeechStub(self.channel)
        return self

    def blocking_channel(self) -> grpc.Channel:
        """A new channel of grpc's blocking API to the gateway, as :attr:`channel` reaches it
        (the caller closes it; use it from another thread, the servers run on the loop)."""
        if self.client_credentials is None:
            return grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return grpc.secure_channel(f"localhost:{self.port}", self.client_credentials)

    @property
    def active_streams(self) -> int:
        """Synthesis streams the gateway is running now."""
        return self.gateway.admission.active

    @property
    def model_name(self) -> str:
        """The default model's served name."""
        return self.gateway.models.default.name

    async def __aexit__(self, *exc: object) -> None:
        for cleanup in reversed(self.cleanups):
            await cleanup()
        await self.channel.close()
        if self.http_server is not None:
            await self.http_server.stop(0)
        await self.server.stop(0)
        await self.gateway.close()
        for server in self.fake_servers:
            await server.stop(0)

    async def synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout: float = 10.0,
    ) -> tuple[tts_pb2.SynthesisMetadata, list[tts_pb2.AudioChunk], tts_pb2.SynthesisSummary]:
        """The whole stream, checked for order: metadata, audio..., summary."""
        responses = [r async for r in self.stub.Synthesize(request, metadata=metadata, timeout=timeout)]
        kinds = [r.WhichOneof("payload") for r in responses]
        assert kinds[0] == "metadata" and kinds[-1] == "summary", kinds
        assert set(kinds[1:-1]) <= {"audio"}, kinds
        return responses[0].metadata, [r.audio for r in responses[1:-1]], responses[-1].summary


async def expect_rpc_error(call: Any) -> grpc.aio.AioRpcError:
    """Drain a streaming call or await a unary one; return the error it must end with."""
    try:
        if hasattr(call, "read"):
            while await call.read() is not grpc.aio.EOF:
                pass
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


async def expect_streaming_error(
    harness: Harness,
    messages: Sequence[tts_pb2.StreamingSynthesizeRequest],
    *,
    timeout: float = 10.0,
    metadata: Sequence[tuple[str, str]] = (),
) -> grpc.RpcError:
    """Send ``messages`` on a StreamingSynthesize call, half-close, drain it; return the error
    it must end with (a :class:`grpc.Call` too: ``code()``, ``details()``), as the gateway sent it.

    Made with grpc's blocking API, in a thread (the servers keep running on the loop): where the
    gateway ends the call before the client has written every message, grpc.aio's client turns
    its write into the ended call into a status of its own, INTERNAL "Internal error from Core"
    (``_StreamRequestMixin._write`` -> ``set_internal_error``), which can replace the status the
    server had already delivered (grpc/grpc#36066), whether a request iterator or ``call.write``
    writes. The blocking API drops the failed write and reports the status the server sent."""

    def call() -> grpc.RpcError:
        with harness.blocking_channel() as channel:
            responses = tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize(
                iter(messages), timeout=timeout, metadata=tuple(metadata)
            )
            try:
                for _ in responses:
                    pass
            except grpc.RpcError as exc:
                return exc
        raise AssertionError("the call succeeded")

    return await asyncio.to_thread(call)


# ---------------------------------------------------------------------------------------------
# Script mode: a fake talker in its own process


async def _serve(stage: str, argv: list[str]) -> None:
    if stage == "talker":
        model_type, frames, delay, *port = argv
        add, fake = (
            stages_pb2_grpc.add_TalkerServicer_to_server,
            FakeTalker(model_type, int(frames), float(delay)),
        )
    else:
        port = argv
        add, fake = stages_pb2_grpc.add_DecoderServicer_to_server, FakeDecoder()
    server, bound = await start_fake(add, fake, int(port[0]) if port else 0)
    print(bound, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    args = sys.argv[1:]
    if not (
        (args[:1] == ["talker"] and len(args) in (4, 5)) or (args[:1] == ["decoder"] and len(args) in (1, 2))
    ):
        raise SystemExit("usage: fake_stages.py talker MODEL_TYPE FRAMES DELAY [PORT] | decoder [PORT]")
    asyncio.run(_serve(args[0], args[1:]))
