"""Several utterances in one response stream: consecutive talker requests (the segments of a long
text; the sentences of streamed text input) spoken back to back, as one continuous audio stream.

:class:`UtteranceSequence` takes utterance plans from an async iterable (all known at once for a
long text, or arriving over time) and runs each as its own :class:`~gateway.stages.pipeline.SynthesisPipeline`
(``Talker.Generate`` piped into ``Decoder.Decode``), in a task of its own that drains the
decoder's audio into a queue, so no stage call ever waits for the client. Its events come out
strictly in order: every event of utterance k (started, audio..., done) before any of k + 1.

Lookahead: utterance k + 1 starts (takes a talker slot) once utterance k has produced audio (or
ended), with at most ``1 + lookahead`` utterances in flight (started and not yet delivered).
Waiting for k's first audio keeps k's time to first audio what it is alone (k + 1's prefill does
not run before k's first frames); once started, k + 1 generates while k is streamed, so its audio
is there when k's ends, and one long request keeps the talker's batch busy.

Silence stop: with a :class:`~tts_common.silence.SilenceStop`, each utterance's audio runs
through a :class:`~tts_common.silence.SilenceDetector`; when it stops one, the audio ends at the
stop and the utterance's pipeline is closed at once (``Cancel``: its talker slot is freed).

Streamed text and cancel: a plan may carry its talker request's text messages (``text``, for a
``text_open`` request, forwarded as they come) and a ``cancelled`` event. Setting the event stops
the utterance at once: no further audio of it is queued, its pipeline is closed (``Cancel``: its
talker slot is freed at the next step), and it ends with FINISH_REASON_CANCELLED; the sequence
goes on with the next plan. A plan cancelled before it started never reaches the stages.

Closing the event iterator (client gone, deadline) cancels every utterance task, and each closes
its pipeline, so every talker slot held is freed. A failure (a stage error, or the plan iterable
raising) is raised where it occurs in the order, after the audio of the utterances before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np

from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.request_ids import REQUEST_ID_METADATA_KEY
from tts_common.silence import SilenceDetector, SilenceStop
from tts_common.synthesis.segments import SegmentPlan, segment_request_id
from tts_common.synthesis.validation import SynthesisPlan, native_sample_rate, talker_request

from ..config import STAGE, FailoverPolicy, GatewayConfig
from ..stages.errors import StageError
from ..stages.pipeline import SynthesisPipeline
from ..stages.routing import StageClient
from .responses import OutputPlan
from .voice import ResolvedVoice

logger = logging.getLogger(__name__)

_SUCCESS = (tts_pb2.FINISH_REASON_EOS, tts_pb2.FINISH_REASON_LENGTH)

NATIVE_FRAME_RATE = 12.5
"""Codec frames per second of the 12 Hz checkpoints (when the talker reports none)."""


@dataclass(frozen=True)
class UtterancePlan:
    """What one utterance sends to the stages (its request id is the talker request's)."""

    talker_request: stages_pb2.TalkerRequest
    decode_start: stages_pb2.DecodeStart
    text_start: int = 0
    """Where the utterance's text lies in the request's text (for the summary)."""
    text_end: int = 0
    text: AsyncIterable[stages_pb2.TalkerClientMessage] | None = None
    """The text messages (AppendText..., EndText) of a ``text_open`` talker request."""
    cancelled: asyncio.Event | None = None
    """Set to stop the utterance (see the module doc)."""


@dataclass(frozen=True)
class UtteranceStarted:
    """Both stage calls of utterance ``index`` are open (the stages accepted it)."""

    index: int


@dataclass(frozen=True)
class UtteranceAudio:
    """The next PCM of utterance ``index``: float32 at the native rate."""

    index: int
    samples: np.ndarray


@dataclass(frozen=True)
class UtteranceDone:
    """Utterance ``index`` is complete: all its audio came before this event."""

    index: int
    plan: UtterancePlan
    start_sample: int
    """Native-rate samples of the utterances before it (its position in the stream)."""
    num_samples: int
    """Its native-rate samples."""
    frames: int
    """Codec frames whose audio was delivered."""
    finish_reason: int
    """``tts_pb2.FinishReason``: EOS, LENGTH, SILENCE or CANCELLED."""
    talker_done: stages_pb2.TalkerDone
    """The talker's final statistics (empty after a silence stop: the talker was cancelled)."""


UtteranceEvent = UtteranceStarted | UtteranceAudio | UtteranceDone


@dataclass(frozen=True)
class SequenceSettings:
    """How a sequence runs its utterances."""

    lookahead: int = 1
    """Utterances generated ahead of the one being delivered."""
    drain_timeout: float = 30.0
    """How long a decoder may stay silent once it has all frames (see SynthesisPipeline)."""
    failover: FailoverPolicy | None = None
    """Bounds of replica failover for each utterance's pipeline (None: the default policy)."""
    silence: SilenceStop | None = None
    """The silence stop, or None for none."""
    sample_rate: int = 24000
    """Native sample rate of the decoder's PCM."""
    frame_samples: int = 1920
    """Native samples per codec frame."""


@dataclass(eq=False)
class _RunningUtterance:
    """An utterance the sequence has started: its events, and whether the next may start."""

    index: int
    plan: UtterancePlan
    events: asyncio.Queue[UtteranceEvent | BaseException] = field(default_factory=asyncio.Queue)
    audible: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the utterance has produced audio or ended (the next one may start)."""
    task: asyncio.Task[None] | None = None
    samples: int = 0
    """Native samples queued so far."""


class _End:
    """No more utterances."""


class UtteranceSequence:
    """Runs utterance plans through the stages and yields their events in order (module doc)."""

    def __init__(
        self,
        talker: StageClient[stages_pb2_grpc.TalkerStub],
        decoder: StageClient[stages_pb2_grpc.DecoderStub],
        settings: SequenceSettings,
        *,
        time_remaining: float | None = None,
    ) -> None:
        """``time_remaining``: the client's deadline, in seconds from now (None: none)."""
        self._talker = talker
        self._decoder = decoder
        self._settings = settings
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self._utterances: list[_RunningUtterance] = []
        self.results: list[UtteranceDone] = []
        """Every delivered utterance's :class:`UtteranceDone`, in order."""

    async def events(self, plans: AsyncIterable[UtterancePlan]) -> AsyncIterator[UtteranceEvent]:
        """Run ``plans`` and yield their events in order; close the iterator to stop everything."""
        queue: asyncio.Queue[_RunningUtterance | _End | BaseException] = asyncio.Queue()
        window = asyncio.Semaphore(1 + self._settings.lookahead)
        producer = asyncio.create_task(self._start_utterances(plans, queue, window), name="utterances")
        position = 0
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    return
                if isinstance(item, BaseException):
                    raise item
                while True:
                    event = await item.events.get()
                    if isinstance(event, BaseException):
                        raise event
                    if isinstance(event, UtteranceDone):
                        event = dataclasses.replace(event, start_sample=position)
                        position += event.num_samples
                        self.results.append(event)
                        reason = tts_pb2.FinishReason.Name(event.finish_reason).removeprefix("FINISH_REASON_")
                        metrics.UTTERANCES.labels(stage=STAGE, finish_reason=reason).inc()
                        yield event
                        break
                    yield event
                window.release()
        finally:
            producer.cancel()
            tasks = [producer, *(u.task for u in self._utterances if u.task is not None)]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _start_utterances(
        self,
        plans: AsyncIterable[UtterancePlan],
        queue: asyncio.Queue[_RunningUtterance | _End | BaseException],
        window: asyncio.Semaphore,
    ) -> None:
        """Start each plan's utterance when the window and the previous one's audio allow."""
        previous: _RunningUtterance | None = None
        try:
            async for plan in plans:
                await window.acquire()
                if previous is not None:
                    await previous.audible.wait()
                utterance = _RunningUtterance(len(self._utterances), plan)
                utterance.task = asyncio.create_task(
                    self._run(utterance), name=f"utterance {utterance.index}"
                )
                self._utterances.append(utterance)
                queue.put_nowait(utterance)
                previous = utterance
        except Exception as exc:  # noqa: BLE001 - the plan source failed: raised in order by events()
            queue.put_nowait(exc)
            return
        queue.put_nowait(_End())

    def _remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.001)

    async def _run(self, utterance: _RunningUtterance) -> None:
        """One utterance through the stages; its events (or its error) go to its queue."""
        plan = utterance.plan
        try:
            if plan.cancelled is not None and plan.cancelled.is_set():
                utterance.events.put_nowait(self._cancelled(utterance, None))
                return
            # The pipeline picks the replicas itself and moves to another one if a replica dies.
            pipeline = SynthesisPipeline(
                self._talker,
                self._decoder,
                plan.talker_request,
                plan.decode_start,
                timeout=self._remaining(),
                metadata=((REQUEST_ID_METADATA_KEY, plan.talker_request.request_id),),
                drain_timeout=self._settings.drain_timeout,
                failover=self._settings.failover,
                text=plan.text,
            )
            try:
                await pipeline.start()
                utterance.events.put_nowait(UtteranceStarted(utterance.index))
                done = await self._stream_until_cancelled(utterance, pipeline)
            finally:
                await pipeline.close()  # a silence stop's Cancel frees the slot here
            utterance.events.put_nowait(done)
        except Exception as exc:  # noqa: BLE001 - delivered in order by events()
            utterance.events.put_nowait(exc)
        finally:
            utterance.audible.set()

    async def _stream_until_cancelled(
        self, utterance: _RunningUtterance, pipeline: SynthesisPipeline
    ) -> UtteranceDone:
        """:meth:`_stream`, stopped as soon as the plan's ``cancelled`` event is set."""
        cancelled = utterance.plan.cancelled
        if cancelled is None:
            return await self._stream(utterance, pipeline)
        stream = asyncio.ensure_future(self._stream(utterance, pipeline))
        cancel = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait({stream, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
            if not stream.done():
                stream.cancel()
            await asyncio.gather(stream, cancel, return_exceptions=True)
        if cancelled.is_set():
            return self._cancelled(utterance, pipeline)
        return stream.result()

    def _cancelled(self, utterance: _RunningUtterance, pipeline: SynthesisPipeline | None) -> UtteranceDone:
        done = pipeline.talker_done if pipeline is not None else None
        return UtteranceDone(
            index=utterance.index,
            plan=utterance.plan,
            start_sample=0,
            num_samples=utterance.samples,
            frames=utterance.samples // self._settings.frame_samples,
            finish_reason=tts_pb2.FINISH_REASON_CANCELLED,
            talker_done=done or stages_pb2.TalkerDone(),
        )

    async def _stream(self, utterance: _RunningUtterance, pipeline: SynthesisPipeline) -> UtteranceDone:
        """Forward the decoder's PCM into the utterance's queue, through the silence stop."""
        settings = self._settings
        detector = (
            SilenceDetector(settings.silence, settings.sample_rate, settings.frame_samples)
            if settings.silence is not None
            else None
        )
        samples = 0
        async with contextlib.aclosing(pipeline.pcm_chunks()) as chunks:
            async for pcm in chunks:
                audio = np.frombuffer(pcm.samples, dtype="<f4")
                keep = detector.push(audio) if detector is not None else None
                if keep is not None:
                    audio = audio[:keep]
                if audio.size:
                    if utterance.plan.cancelled is not None and utterance.plan.cancelled.is_set():
                        return self._cancelled(utterance, pipeline)  # cancelled meanwhile
                    utterance.events.put_nowait(UtteranceAudio(utterance.index, audio))
                    samples += audio.size
                    utterance.samples = samples
                    utterance.audible.set()
                if keep is not None:
                    logger.info(
                        "utterance %s: silence stop after %.2f s of audio",
                        utterance.plan.talker_request.request_id,
                        samples / settings.sample_rate,
                    )
                    return UtteranceDone(
                        index=utterance.index,
                        plan=utterance.plan,
                        start_sample=0,
                        num_samples=samples,
                        frames=samples // settings.frame_samples,
                        finish_reason=tts_pb2.FINISH_REASON_SILENCE,
                        talker_done=pipeline.talker_done or stages_pb2.TalkerDone(),
                    )
        done = pipeline.talker_done
        assert done is not None  # DecodeDone only follows TalkerDone
        if done.finish_reason not in _SUCCESS:
            raise StageError(
                "talker",
                grpc.StatusCode.UNAVAILABLE,
                f"generation ended early (finish_reason {tts_pb2.FinishReason.Name(done.finish_reason)})",
            )
        return UtteranceDone(
            index=utterance.index,
            plan=utterance.plan,
            start_sample=0,
            num_samples=samples,
            frames=done.frames,
            finish_reason=done.finish_reason,
            talker_done=done,
        )


def sequence_settings(
    config: GatewayConfig, plan: SynthesisPlan, info: tts_pb2.ModelInfo
) -> SequenceSettings:
    """How a request's utterances run: the server's lookahead, drain timeout and failover, and
    the silence stop (the request's switch over the server's)."""
    on = config.silence_stop if plan.silence_stop is None else plan.silence_stop
    rate = native_sample_rate(info)
    return SequenceSettings(
        lookahead=config.segment_lookahead,
        drain_timeout=config.stage_timeout_seconds,
        failover=FailoverPolicy.from_config(config),
        silence=SilenceStop(config.silence_threshold_dbfs, config.silence_stop_seconds) if on else None,
        sample_rate=rate,
        frame_samples=round(rate / (info.frame_rate or NATIVE_FRAME_RATE)),
    )


def utterance_plan(
    segment: SegmentPlan, request_id: str, voice: ResolvedVoice, out: OutputPlan
) -> UtterancePlan:
    """What the stages are sent for one segment of a request."""
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


__all__ = [
    "SequenceSettings",
    "UtteranceAudio",
    "UtteranceDone",
    "UtteranceEvent",
    "UtterancePlan",
    "UtteranceSequence",
    "UtteranceStarted",
    "sequence_settings",
    "utterance_plan",
]
