"""The gateway's core, independent of the transport: what a Synthesize, a voice registration or a
model-info request does, for the gRPC servicer (:mod:`gateway.server`) and any other front end.

``synthesize``: admission (at most ``max_concurrent_streams`` streams, else RESOURCE_EXHAUSTED at
once) -> the shared validator against the talker's model info -> voice resolution (registered
voice, or the speaker stage for an inline clone) -> the text cut into segments
(``tts_common.synthesis.segments``; one for a text that fits a talker request) -> the segments as
consecutive utterances (:mod:`gateway.utterances`, each ``Talker.Generate`` piped into
``Decoder.Decode`` by :mod:`gateway.pipeline`, the next one generating while the current one
streams) -> PCM encoded as requested (:mod:`gateway.audio_stream`). It yields
``SynthesizeResponse`` messages: one metadata, audio chunks, one summary. Closing the iterator
(client gone, deadline) cancels every stage call; a stage failing mid-stream raises a StageError
naming the stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from tts_common import metrics
from tts_common.errors import CapacityError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth
from tts_common.serving.names import service_name
from tts_common.serving.server import channel_options, keepalive_channel_options
from tts_common.silence import SilenceStop
from tts_common.synthesis.segments import (
    SegmentPlan,
    first_segment,
    plan_segments,
    request_segment_size,
    segment_request_id,
)
from tts_common.synthesis.validation import (
    RequestLimits,
    SynthesisPlan,
    effective_model_info,
    native_sample_rate,
    talker_request,
)
from tts_common.text import TokenCounter

from .audio_stream import AudioStream, OutputPlan
from .cloning import ResolvedVoice, VoiceResolver
from .config import STAGE, FailoverPolicy, GatewayConfig
from .model_info import REFRESH_TIMEOUT_S, TalkerInfoCache
from .pipeline import StageError
from .prepared import PreparedRequest
from .routing import StageClient, tie_readiness
from .text_stream import TextStream
from .tokens import TalkerTokenCounter
from .utterances import (
    SequenceSettings,
    UtteranceAudio,
    UtteranceDone,
    UtterancePlan,
    UtteranceSequence,
    UtteranceStarted,
    overall_finish_reason,
    segment_summaries,
)
from .validation import validate_register, validate_synthesize
from .voices import StoredVoice, VoiceStore, new_voice_id

logger = logging.getLogger(__name__)

_RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A stage that starts after the gateway, or restarts, is used again within about a second:
    # gRPC's default backoff grows to 120 s, and while a channel backs off its calls fail at once
    # and its health checks cannot see the replica recover, so a wait for a healthy replica
    # (--failover-wait-seconds, 3 s) must outlast one backoff. Reconnecting to a dead loopback or
    # in-cluster peer once a second costs nothing worth saving.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

NATIVE_FRAME_RATE = 12.5
"""Codec frames per second of the 12 Hz checkpoints (when the talker reports none)."""
INLINE_SEGMENTING_CHARS = 1000
"""Texts up to this length are segmented on the event loop (about 3.5 ms per thousand characters
with a released tokenizer); longer ones in a worker thread."""

TalkerClient = StageClient[stages_pb2_grpc.TalkerStub]
DecoderClient = StageClient[stages_pb2_grpc.DecoderStub]
SpeakerClient = StageClient[stages_pb2_grpc.SpeakerStub]


class _Segmentation:
    """A request's segments as they become known. A text up to ``INLINE_SEGMENTING_CHARS`` is
    segmented at once. A longer one is segmented whole in a worker thread (tens of milliseconds
    for a chapter) while its first segment comes at once from a prefix
    (:func:`~tts_common.synthesis.segments.first_segment`): the talker starts on it, and the
    text's length costs no time to first audio."""

    def __init__(
        self, plan: SynthesisPlan, first: SegmentPlan | None, whole: asyncio.Future[list[SegmentPlan]]
    ) -> None:
        self._plan = plan
        self._first = first
        self._whole = whole
        # A stream closed before the segmentation ends never looks at it: nor should asyncio.
        whole.add_done_callback(lambda done: done.cancelled() or done.exception())

    @classmethod
    async def start(cls, plan: SynthesisPlan, max_tokens: int, count: TokenCounter) -> _Segmentation:
        """Begin segmenting ``plan``'s text into segments of at most ``max_tokens`` tokens."""
        if len(plan.text) <= INLINE_SEGMENTING_CHARS:
            whole = asyncio.get_running_loop().create_future()
            try:
                whole.set_result(plan_segments(plan, max_tokens, count))
            except Exception as exc:  # noqa: BLE001 - raised by complete() and segments()
                whole.set_exception(exc)
            return cls(plan, None, whole)
        first = await asyncio.to_thread(first_segment, plan, max_tokens, count)
        return cls(
            plan, first, asyncio.ensure_future(asyncio.to_thread(plan_segments, plan, max_tokens, count))
        )

    async def complete(self) -> list[SegmentPlan]:
        """Every segment; raises the request's error (e.g. a word too long) if the text is refused."""
        return await asyncio.shield(self._whole)

    async def segments(self) -> AsyncIterator[SegmentPlan]:
        """The segments in order, the first as soon as it is known."""
        first = self._first
        if first is not None:
            yield first
        segments = await self.complete()
        if len(segments) > 1:
            logger.info("text of %d characters spoken as %d segments", len(self._plan.text), len(segments))
        if first is None:
            for segment in segments:
                yield segment
            return
        if segments[0] != first:  # cannot happen (first_segment's property test); never repeat text
            logger.error("segment 0 from the prefix differs from the whole text's; continuing after it")
        for segment in segments:
            if segment.start >= first.end:
                yield segment


class SynthesisService:
    """The public API's behaviour (see the module doc). Build it inside the running event loop."""

    def __init__(
        self,
        config: GatewayConfig,
        talker: TalkerClient,
        decoder: DecoderClient,
        speaker: SpeakerClient | None,
        voices: VoiceStore | None = None,
    ) -> None:
        self.config = config
        self.talker = talker
        self.decoder = decoder
        self.speaker = speaker
        self.voices = voices or VoiceStore(config.voices_dir, config.max_voices)
        self.limits = RequestLimits(
            max_text_chars=config.max_text_chars,
            max_instruct_chars=config.max_instruct_chars,
            max_ref_audio_seconds=config.max_ref_audio_seconds,
            max_ref_audio_bytes=config.max_ref_audio_bytes,
        )
        self.model_info = TalkerInfoCache(
            talker,
            ttl_seconds=config.model_info_ttl_seconds,
            refresh_timeout_seconds=min(REFRESH_TIMEOUT_S, config.stage_timeout_seconds),
        )
        self.failover = FailoverPolicy.from_config(config)
        self.voice_resolver = VoiceResolver(
            speaker, self.voices, self.limits, config.stage_timeout_seconds, failover=self.failover
        )
        self.token_counter = TalkerTokenCounter(
            talker,
            timeout_seconds=config.stage_timeout_seconds,
            retry_seconds=config.model_info_ttl_seconds,
        )
        self.active_streams = 0

    @classmethod
    def from_config(
        cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None
    ) -> SynthesisService:
        """Create the stage clients (channels) from ``config``; call inside the event loop.
        ``options``: base channel options (default :func:`tts_common.serving.channel_options`)."""
        opts = [
            *(channel_options() if options is None else options),
            *_RECONNECT_OPTIONS,
            *keepalive_channel_options(config.keepalive_seconds, config.keepalive_timeout_seconds),
            *config.channel_options,
        ]

        def client(
            service: str, targets: Sequence[str], stub: Callable[[grpc.aio.Channel], Any]
        ) -> StageClient[Any]:
            """The stage's client, health-checked on its own service name."""
            return StageClient(
                service.lower(), targets, stub, options=opts, health_service=service_name(stages_pb2, service)
            )

        talker = client("Talker", config.talker_targets, stages_pb2_grpc.TalkerStub)
        decoder = client("Decoder", config.decoder_targets, stages_pb2_grpc.DecoderStub)
        speaker = None
        if config.speaker_targets:
            speaker = client("Speaker", config.speaker_targets, stages_pb2_grpc.SpeakerStub)
        return cls(config, talker, decoder, speaker)

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load registered voices and wait until the talker answers GetModelInfo (the server
        reports NOT_SERVING meanwhile); start checking the stage replicas' health."""
        for client in self.stage_clients:
            client.start_health_checks(
                self.config.health_check_interval_seconds, self.config.health_check_timeout_seconds
            )
        await asyncio.to_thread(self.voices.load)
        info = await self.model_info.wait_until_available(self.config.startup_timeout_seconds)
        await self.token_counter.load()
        model = info.model
        logger.info(
            "talker model: %s (%s %s), %d speakers, %d languages, instruct %s; speaker stage %s",
            model.model_name,
            model.model_type,
            model.model_size,
            len(model.speakers),
            len(model.languages),
            model.instruct_supported,
            "configured" if self.speaker else "not configured (no voice cloning)",
        )

    @property
    def stage_clients(self) -> tuple[StageClient[Any], ...]:
        """The clients of every configured stage."""
        return tuple(c for c in (self.talker, self.decoder, self.speaker) if c is not None)

    def tie_readiness(self, health: ServingHealth) -> None:
        """Make ``health`` report NOT_SERVING for the public services while no talker or no
        decoder replica passes its health checks (SERVING again once one does). The speaker is
        left out: without it only voice cloning fails."""
        tie_readiness(health, (self.talker, self.decoder))

    async def close(self) -> None:
        """Stop the health checks, the tokenizer fetch and close every stage channel."""
        await self.token_counter.close()
        for client in self.stage_clients:
            await client.close()

    # --- model info and voices -----------------------------------------------------------------
    async def public_model_info(self) -> tts_pb2.ModelInfo:
        """The served model as clients see it (voice cloning only with a speaker stage)."""
        info = effective_model_info(await self.model_info.get())
        info.voice_clone_supported = info.voice_clone_supported and self.speaker is not None
        return info

    async def list_voices(self) -> tts_pb2.ListVoicesResponse:
        info = await self.public_model_info()
        return tts_pb2.ListVoicesResponse(
            model_type=info.model_type,
            model_size=info.model_size,
            speakers=info.speakers,
            languages=info.languages,
            instruct_supported=info.instruct_supported,
            voice_clone_supported=info.voice_clone_supported,
            voices=[v.voice for v in self.voices.list_voices()],
            sample_rate=info.sample_rate,
        )

    async def register_voice(
        self, request: tts_pb2.RegisterVoiceRequest, request_id: str, time_remaining: float | None
    ) -> tts_pb2.Voice:
        """Embed the reference once and store the voice (RESOURCE_EXHAUSTED past the limit)."""
        talker = await self.model_info.get()
        validate_register(request, talker.model, self.limits)
        self.voices.check_capacity()
        reference = request.reference
        embedding = await self.voice_resolver.embed(
            reference, request_id, time_remaining, talker, "reference"
        )
        created = Timestamp()
        created.GetCurrentTime()
        stored = StoredVoice(
            voice=tts_pb2.Voice(
                voice_id=new_voice_id(),
                name=request.name,
                x_vector_only=reference.x_vector_only,
                ref_text="" if reference.x_vector_only else reference.ref_text,
                ref_audio_seconds=embedding.audio_seconds,
                created_at=created,
            ),
            speaker_embedding=list(embedding.speaker_embedding),
            ref_codes=None if reference.x_vector_only else embedding.ref_codes,
            model_name=talker.model.model_name,
            audio_sha256=embedding.audio_sha256,
        )
        await self.voices.add(stored)
        logger.info(
            "registered voice %s (%r, %s, %.1f s reference)",
            stored.voice_id,
            request.name,
            "x-vector only" if reference.x_vector_only else "in-context",
            stored.voice.ref_audio_seconds,
        )
        return stored.voice

    async def delete_voice(self, voice_id: str) -> None:
        if not voice_id.strip():
            raise InvalidRequestError("voice_id is empty")
        await self.voices.delete(voice_id.strip())
        logger.info("deleted voice %s", voice_id)

    # --- synthesis ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admission(self, received: float) -> Iterator[None]:
        """One stream's place (RESOURCE_EXHAUSTED at once when the server is at capacity), for
        Synthesize and StreamingSynthesize alike; an admitted stream's duration since
        ``received`` is recorded when it ends. A stream that fails with the talker unavailable
        makes the next request re-fetch the model info."""
        limit = self.config.max_concurrent_streams
        if self.active_streams >= limit:
            raise CapacityError(f"server at capacity ({limit} concurrent Synthesize streams); retry later")
        self.active_streams += 1
        metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)
        try:
            yield
        except StageError as exc:
            if exc.stage == "talker" and exc.code is grpc.StatusCode.UNAVAILABLE:
                self.model_info.invalidate()  # a restarted or replaced talker may report other info
            raise
        finally:
            self.active_streams -= 1
            metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)
            metrics.REQUEST_DURATION.labels(stage=STAGE).observe(time.monotonic() - received)

    async def synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        *,
        received: float,
        time_remaining: float | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """The response stream of one Synthesize request (see the module doc). ``speed``: the
        output's time-scale factor (OpenAI's ``speed``; 1.0 leaves the audio untouched)."""
        with self.admission(received):
            async for response in self._synthesize(request, request_id, received, time_remaining, speed):
                yield response

    async def stream_synthesize(
        self,
        config: tts_pb2.SynthesizeRequest,
        messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        request_id: str,
        *,
        received: float,
        time_remaining: float | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """The response stream of one StreamingSynthesize call (:mod:`gateway.text_stream`):
        ``config`` is its first message (``gateway.text_input.read_config``), ``messages`` the
        rest (text, flush, cancel) until the client's half-close."""
        with self.admission(received):
            metrics.TEXT_STREAMS.labels(stage=STAGE).inc()
            try:
                prepared = await self.prepare(config, request_id, time_remaining, streamed_text=True)
                stream = TextStream(
                    self,
                    prepared,
                    messages,
                    request_id,
                    received=received,
                    time_remaining=time_remaining,
                    speed=speed,
                )
                async for response in stream.responses():
                    yield response
            finally:
                metrics.TEXT_STREAMS.labels(stage=STAGE).dec()

    async def _synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        received: float,
        time_remaining: float | None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        prepared = await self.prepare(request, request_id, time_remaining)
        plan, out, voice = prepared.plan, prepared.output_plan, prepared.voice
        segmentation = await _Segmentation.start(plan, *self.segment_size(plan, voice, prepared.max_seq_len))
        sequence = self.sequence(prepared, time_remaining)
        plans = (
            self.utterance_plan(segment, request_id, voice, out) async for segment in segmentation.segments()
        )
        stream = prepared.audio_stream(received, speed)
        async with contextlib.aclosing(sequence.events(plans)) as events:
            async for event in events:
                if isinstance(event, UtteranceAudio):
                    yield await stream.chunk(event.samples)
                elif isinstance(event, UtteranceStarted) and event.index == 0:
                    # A text the whole segmentation refuses is refused before any response.
                    await segmentation.complete()
                    yield prepared.metadata(request_id)
        final = await stream.finish()
        if final is not None:
            yield final
        yield tts_pb2.SynthesizeResponse(
            summary=self._summary(
                stream, sequence.results, out.sample_rate / native_sample_rate(prepared.info)
            )
        )

    async def prepare(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        time_remaining: float | None,
        *,
        streamed_text: bool = False,
    ) -> PreparedRequest:
        """Validate a Synthesize request (or, ``streamed_text``, a StreamingSynthesize
        configuration) against the served model and resolve its voice."""
        talker_info = await self.model_info.get()
        info = effective_model_info(talker_info)
        plan, out = validate_synthesize(
            request,
            info,
            self.limits,
            self.config.default_first_chunk_frames,
            self.config.default_max_chunk_frames,
            streamed_text=streamed_text,
        )
        voice = await self.voice_resolver.resolve(plan, request_id, time_remaining, talker_info)
        return PreparedRequest(plan, out, info, voice, talker_info.max_seq_len)

    def segment_size(
        self, plan: SynthesisPlan, voice: ResolvedVoice, max_seq_len: int
    ) -> tuple[int, TokenCounter]:
        """The most text tokens one talker request of this request may take (the segment size
        its prompt leaves room for), and the token counter they are counted with."""
        count = self.token_counter.counter()
        size = request_segment_size(
            count,
            plan,
            ref_text=voice.ref_text,
            ref_codes=voice.ref_codes,
            max_seq_len=max_seq_len,
            configured=self.config.segment_tokens,
        )
        return size, count

    @staticmethod
    def utterance_plan(
        segment: SegmentPlan, request_id: str, voice: ResolvedVoice, out: OutputPlan
    ) -> UtterancePlan:
        """What the stages are sent for one segment."""
        utterance_id = segment_request_id(request_id, segment.index)
        message = talker_request(
            segment.plan,
            utterance_id,
            speaker_embedding=voice.speaker_embedding,
            ref_codes=voice.ref_codes,
            ref_text=voice.ref_text,
        )
        decode_start = stages_pb2.DecodeStart(
            request_id=utterance_id,
            first_chunk_frames=out.first_chunk_frames,
            max_chunk_frames=out.max_chunk_frames,
        )
        if voice.ref_codes is not None and voice.ref_codes.num_frames > 0:
            decode_start.prefix_codes.CopyFrom(voice.ref_codes)  # left context; its audio is not sent
        return UtterancePlan(message, decode_start, text_start=segment.start, text_end=segment.end)

    def sequence(self, prepared: PreparedRequest, time_remaining: float | None) -> UtteranceSequence:
        """The utterance sequence a prepared request's segments run through."""
        return UtteranceSequence(
            self.talker,
            self.decoder,
            self.sequence_settings(prepared.plan, prepared.info),
            time_remaining=time_remaining,
        )

    def sequence_settings(self, plan: SynthesisPlan, info: tts_pb2.ModelInfo) -> SequenceSettings:
        """Lookahead, drain timeout and the silence stop (the request's switch over the server's)."""
        config = self.config
        on = config.silence_stop if plan.silence_stop is None else plan.silence_stop
        rate = native_sample_rate(info)
        return SequenceSettings(
            lookahead=config.segment_lookahead,
            drain_timeout=config.stage_timeout_seconds,
            failover=self.failover,
            silence=SilenceStop(config.silence_threshold_dbfs, config.silence_stop_seconds) if on else None,
            sample_rate=rate,
            frame_samples=round(rate / (info.frame_rate or NATIVE_FRAME_RATE)),
        )

    @staticmethod
    def stream_summary(
        stream: AudioStream, results: list[UtteranceDone], num_segments: int
    ) -> tts_pb2.SynthesisSummary:
        """A stream's summary without its per-segment entries: the totals over ``results`` (the
        utterances that ended, cancelled ones included), the segment count and the segments cut
        at their budget."""
        spoken = [r for r in results if r.finish_reason != tts_pb2.FINISH_REASON_CANCELLED]
        totals = stages_pb2.TalkerDone(
            frames=sum(r.frames for r in results),
            finish_reason=overall_finish_reason(spoken),
            queue_ms=results[0].talker_done.queue_ms if results else 0.0,
        )
        summary = stream.summary(totals)
        summary.num_segments = num_segments
        summary.length_segments.extend(
            r.index for r in results if r.finish_reason == tts_pb2.FINISH_REASON_LENGTH
        )
        return summary

    @staticmethod
    def _summary(
        stream: AudioStream, results: list[UtteranceDone], output_ratio: float
    ) -> tts_pb2.SynthesisSummary:
        """The stream's totals over every segment."""
        summary = SynthesisService.stream_summary(stream, results, len(results))
        summary.segments.extend(segment_summaries(results, output_ratio, stream.num_samples))
        return summary
