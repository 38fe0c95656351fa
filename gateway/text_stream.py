"""StreamingSynthesize's core, for any transport (:meth:`gateway.service.SynthesisService.
stream_synthesize`): text deltas in, the Synthesize response stream out, plus an
``utterance_end`` per utterance.

Three parts run side by side and meet in one queue, whose order is the response order:

* the reader takes the client's messages (after the configuration) with the idle timeout, cuts
  the text into utterances (:class:`gateway.text_input.UtteranceCutter`) and turns each into a
  ``text_open`` talker request whose ``AppendText`` / ``EndText`` messages follow as the text
  arrives (one feed queue per utterance);
* the :class:`~gateway.utterances.UtteranceSequence` runs those utterances back to back, its
  events pumped into the queue;
* the response generator encodes the audio and writes the utterance ends and the summary.

Cancel: the reader stops every utterance not yet finished (their ``cancelled`` events: the
sequence closes their pipelines, freeing the talker slots) and queues a cancel marker. When the
generator reaches the marker it sends each stopped utterance's ``utterance_end`` (CANCELLED, the
samples actually sent): the acknowledgement. Audio of a stopped utterance is dropped from the
moment the reader saw the cancel, so none follows the acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from tts_common import metrics
from tts_common.errors import DeadlineExceededError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.segments import SegmentPlan, segment_plan
from tts_common.synthesis.validation import RequestLimits, SynthesisPlan
from tts_common.text import TokenCounter

from .audio_stream import AudioStream, OutputPlan
from .cloning import ResolvedVoice
from .config import STAGE, GatewayConfig
from .prepared import PreparedRequest
from .text_input import (
    AppendUtteranceText,
    EndUtterance,
    OpenUtterance,
    TextAction,
    UtteranceCutter,
    check_message,
    check_total_text,
)
from .utterances import (
    UtteranceAudio,
    UtteranceDone,
    UtteranceEvent,
    UtterancePlan,
    UtteranceSequence,
)


class StreamServices(Protocol):
    """What a :class:`TextStream` uses of :class:`gateway.service.SynthesisService` (which
    creates it; a protocol keeps this module from importing the service back)."""

    config: GatewayConfig
    limits: RequestLimits

    def segment_size(
        self, plan: SynthesisPlan, voice: ResolvedVoice, max_seq_len: int
    ) -> tuple[int, TokenCounter]: ...

    def sequence(self, prepared: PreparedRequest, time_remaining: float | None) -> UtteranceSequence: ...

    def utterance_plan(
        self, segment: SegmentPlan, request_id: str, voice: ResolvedVoice, out: OutputPlan
    ) -> UtterancePlan: ...

    def stream_summary(
        self, stream: AudioStream, results: list[UtteranceDone], num_segments: int
    ) -> tts_pb2.SynthesisSummary: ...


logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Utterance:
    index: int
    text_start: int
    text_end: int
    seed: int
    feed: asyncio.Queue[stages_pb2.TalkerClientMessage | None] = field(default_factory=asyncio.Queue)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    start_sample: int | None = None
    """Output position of its first sample sent."""
    samples_sent: int = 0
    """Output samples sent."""
    ended: bool = False
    """Its utterance_end was sent."""
    done: UtteranceDone | None = None


@dataclass(frozen=True)
class _Cancelled:
    utterances: list[_Utterance]


class _Finished:
    """Every utterance was delivered."""


_Item = UtteranceEvent | _Cancelled | _Finished | BaseException


async def _messages_of(
    feed: asyncio.Queue[stages_pb2.TalkerClientMessage | None],
) -> AsyncIterator[stages_pb2.TalkerClientMessage]:
    while (message := await feed.get()) is not None:
        yield message


class TextStream:
    """One StreamingSynthesize stream after its configuration was accepted."""

    def __init__(
        self,
        service: StreamServices,
        prepared: PreparedRequest,
        messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        request_id: str,
        *,
        received: float,
        time_remaining: float | None,
        speed: float = 1.0,
    ) -> None:
        self._service = service
        self._prepared = prepared
        self._messages = messages
        self._request_id = request_id
        self._received = received
        self._time_remaining = time_remaining
        self._speed = speed
        self._idle_timeout = service.config.text_idle_timeout_seconds
        self._last_activity = time.monotonic()
        self._out: asyncio.Queue[_Item] = asyncio.Queue()
        self._plans: asyncio.Queue[UtterancePlan | None] = asyncio.Queue()
        self._utterances: list[_Utterance] = []
        self._current: _Utterance | None = None
        size, count = service.segment_size(prepared.plan, prepared.voice, prepared.max_seq_len)
        self._cutter = UtteranceCutter(size, count)

    async def responses(self) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """Metadata, then audio and utterance ends as they come, then the summary."""
        prepared = self._prepared
        stream = prepared.audio_stream(self._received, self._speed)
        sequence = self._service.sequence(prepared, self._time_remaining)
        yield prepared.metadata(self._request_id)
        reader = asyncio.create_task(self._read(), name="text reader")
        pump = asyncio.create_task(self._pump(sequence), name="utterance events")
        try:
            while True:
                item = await self._out.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Finished):
                    break
                if isinstance(item, _Cancelled):
                    for utterance in item.utterances:
                        if not utterance.ended:
                            metrics.CANCELLED_UTTERANCES.labels(stage=STAGE).inc()
                            yield self._utterance_end(utterance, stream, tts_pb2.FINISH_REASON_CANCELLED)
                elif isinstance(item, UtteranceAudio):
                    utterance = self._utterances[item.index]
                    if utterance.cancelled.is_set():
                        continue
                    response = await stream.chunk(item.samples)
                    if utterance.start_sample is None:
                        utterance.start_sample = response.audio.start_sample
                    utterance.samples_sent += response.audio.num_samples
                    self._last_activity = time.monotonic()
                    yield response
                elif isinstance(item, UtteranceDone):
                    utterance = self._utterances[item.index]
                    utterance.done = item
                    self._observe(item.talker_done)
                    if not utterance.ended:
                        yield self._utterance_end(utterance, stream, item.finish_reason)
            final = await stream.finish()
            if final is not None:
                yield final
            yield tts_pb2.SynthesizeResponse(summary=self._summary(stream, sequence.results))
        finally:
            for task in (reader, pump):
                task.cancel()
            await asyncio.gather(reader, pump, return_exceptions=True)

    # --- client side ----------------------------------------------------------------------
    async def _read(self) -> None:
        """Read the client's messages until the half-close (errors go to the response queue)."""
        pending: asyncio.Future[tts_pb2.StreamingSynthesizeRequest] | None = None
        total = 0
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(self._next())
                message = await self._wait(pending)
                pending = None
                if message is None:
                    break
                self._last_activity = time.monotonic()
                kind = check_message(message)
                if kind == "text":
                    total += len(message.text)
                    check_total_text(total, self._service.limits.max_text_chars)
                    self._apply(self._cutter.push(message.text))
                elif kind == "flush":
                    self._apply(self._cutter.flush())
                else:
                    self._cancel()
            self._apply(self._cutter.flush())
            if not self._utterances:
                raise InvalidRequestError(
                    "no text to speak: the stream ended (half-close) before any text with a letter or digit"
                )
            self._plans.put_nowait(None)
        except Exception as exc:  # noqa: BLE001 - reported in order by responses()
            self._out.put_nowait(exc)
        finally:
            if pending is not None:
                pending.cancel()

    async def _next(self) -> tts_pb2.StreamingSynthesizeRequest | None:
        try:
            return await anext(self._messages)
        except StopAsyncIteration:
            return None

    async def _wait(
        self, pending: asyncio.Future[tts_pb2.StreamingSynthesizeRequest | None]
    ) -> tts_pb2.StreamingSynthesizeRequest | None:
        """The next message, or DEADLINE_EXCEEDED once neither a message came nor audio left
        for the idle timeout."""
        while True:
            remaining = self._last_activity + self._idle_timeout - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceededError(
                    f"the text stayed open with no message for {self._idle_timeout:g} s "
                    "(send text, flush or close the stream; --text-idle-timeout-seconds)"
                )
            done, _ = await asyncio.wait({pending}, timeout=remaining)
            if done:
                return pending.result()

    def _apply(self, actions: list[TextAction]) -> None:
        for action in actions:
            if isinstance(action, OpenUtterance):
                self._current = self._open(action)
            elif isinstance(action, AppendUtteranceText):
                assert self._current is not None
                self._current.feed.put_nowait(
                    stages_pb2.TalkerClientMessage(append_text=stages_pb2.AppendText(text=action.text))
                )
                self._current.text_end += len(action.text)
            elif isinstance(action, EndUtterance):
                assert self._current is not None
                self._current.feed.put_nowait(stages_pb2.TalkerClientMessage(end_text=stages_pb2.EndText()))
                self._current.feed.put_nowait(None)
                self._current = None

    def _open(self, action: OpenUtterance) -> _Utterance:
        """Queue the next utterance's talker request (text open)."""
        plan = self._prepared.plan
        index = len(self._utterances)
        segment = segment_plan(plan, index, action.start, action.start + len(action.text), action.text)
        utterance = _Utterance(index, segment.start, segment.end, segment.seed)
        stages = self._service.utterance_plan(
            segment, self._request_id, self._prepared.voice, self._prepared.output_plan
        )
        stages.talker_request.text_open = True
        self._plans.put_nowait(
            dataclasses.replace(stages, text=_messages_of(utterance.feed), cancelled=utterance.cancelled)
        )
        self._utterances.append(utterance)
        return utterance

    def _cancel(self) -> None:
        """Stop every utterance not yet finished and drop the text held back."""
        self._cutter.cancel()
        self._current = None
        stopped = [u for u in self._utterances if u.done is None and not u.cancelled.is_set()]
        for utterance in stopped:
            utterance.cancelled.set()
            utterance.feed.put_nowait(None)
        if stopped:
            logger.info("cancel: stopped utterance(s) %s", ", ".join(str(u.index) for u in stopped))
            self._out.put_nowait(_Cancelled(stopped))

    # --- stage side -----------------------------------------------------------------------
    async def _plan_source(self) -> AsyncIterator[UtterancePlan]:
        while (plan := await self._plans.get()) is not None:
            yield plan

    async def _pump(self, sequence: UtteranceSequence) -> None:
        try:
            async with contextlib.aclosing(sequence.events(self._plan_source())) as events:
                async for event in events:
                    self._out.put_nowait(event)
            self._out.put_nowait(_Finished())
        except Exception as exc:  # noqa: BLE001 - reported in order by responses()
            self._out.put_nowait(exc)

    # --- responses ------------------------------------------------------------------------
    def _utterance_end(
        self, utterance: _Utterance, stream: AudioStream, reason: int
    ) -> tts_pb2.SynthesizeResponse:
        utterance.ended = True
        done = utterance.done.talker_done if utterance.done is not None else stages_pb2.TalkerDone()
        start = utterance.start_sample if utterance.start_sample is not None else stream.num_samples
        return tts_pb2.SynthesizeResponse(
            utterance_end=tts_pb2.UtteranceEnd(
                index=utterance.index,
                text_start=utterance.text_start,
                text_end=utterance.text_end,
                start_sample=start,
                num_samples=utterance.samples_sent,
                finish_reason=reason,
                seed=utterance.seed,
                text_wait_ms=done.text_wait_ms,
                stalled_frames=done.stalled_frames,
            )
        )

    @staticmethod
    def _observe(done: stages_pb2.TalkerDone) -> None:
        metrics.TEXT_WAIT_TIME.labels(stage=STAGE).observe(done.text_wait_ms / 1000)
        if done.stalled_frames:
            metrics.STALLED_FRAMES.labels(stage=STAGE).inc(done.stalled_frames)

    def _summary(self, stream: AudioStream, results: list[UtteranceDone]) -> tts_pb2.SynthesisSummary:
        summary = self._service.stream_summary(stream, results, len(self._utterances))
        for utterance in self._utterances:
            done = utterance.done
            summary.segments.append(
                tts_pb2.SegmentSummary(
                    index=utterance.index,
                    text_start=utterance.text_start,
                    text_end=utterance.text_end,
                    seed=utterance.seed,
                    start_sample=utterance.start_sample or 0,
                    num_samples=utterance.samples_sent,
                    frames=done.frames if done is not None else 0,
                    finish_reason=tts_pb2.FINISH_REASON_CANCELLED
                    if utterance.cancelled.is_set()
                    else (done.finish_reason if done is not None else 0),
                )
            )
            if done is not None:
                summary.text_wait_ms += done.talker_done.text_wait_ms
                summary.stalled_frames += done.talker_done.stalled_frames
        return summary


__all__ = ["TextStream"]
