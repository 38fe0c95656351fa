"""One StreamingSynthesize stream after its configuration was accepted
(:class:`StreamingSession`, run by :mod:`gateway.core.streamed` for any transport): text deltas
in, the Synthesize response stream out, plus an ``utterance_end`` per utterance. The session is
handed what it works with (the prepared request, its utterance sequence, its response builder,
its utterance cutter) and calls nothing above it.

Three parts run side by side and meet in one queue, whose order is the response order:

* the reader takes the client's messages (after the configuration) with the idle timeout, cuts
  the text into utterances (:class:`~gateway.synthesis.text_cutter.UtteranceCutter`) and turns each into a
  ``text_open`` talker request whose ``AppendText`` / ``EndText`` messages follow as the text
  arrives (one feed queue per utterance);
* the :class:`~gateway.synthesis.utterances.UtteranceSequence` runs those utterances back to back, its
  events pumped into the queue;
* the response generator hands the audio, the utterance ends and the summary to the stream's
  :class:`~gateway.synthesis.responses.ResponseBuilder`.

Backpressure: the queue holds at most :data:`QUEUED_AUDIO_CHUNKS` audio chunks; the pump awaits
room before it takes the next event from the sequence, so a slow reader (gRPC or WebSocket)
paces the stages: the sequence's lookahead bounds the utterances generated ahead of the one
delivered, as for Synthesize, instead of the gateway buffering the whole audio. Only the pump
ever waits for room, and only for audio: the reader's cancel markers and errors, the pump's
utterance ends, end and errors, and the timings always go in at once, so nothing the reader or
the aligner does waits for the client, and audio never waits for timings. Audio of a stopped
utterance is dropped without taking room (or giving it back at once).

Cancel: the reader stops every utterance not yet finished (their ``cancelled`` events: the
sequence closes their pipelines, freeing the talker slots) and queues a cancel marker. When the
generator reaches the marker it sends each stopped utterance's ``utterance_end`` (CANCELLED, the
samples it had sent): the acknowledgement. Audio of a stopped utterance is dropped from the
moment the reader saw the cancel, so none follows the acknowledgement. An utterance whose end
the generator had not reached is not finished: if the sequence finished it as the reader saw
the cancel (its end queued before the marker), the marker acknowledges it all the same.

Timestamps: with a :class:`~gateway.synthesis.timestamps.Timestamper`, each utterance is aligned
once its ``utterance_end`` is sent (its timings join the queue when ready, and go out between
later audio; the summary waits for the last); a cancelled utterance's acknowledgement names the
last unit of its audio sent whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tts_common import metrics
from tts_common.errors import DeadlineExceededError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.segments import segment_plan

from ..config import STAGE
from .request import PreparedRequest
from .responses import ResponseBuilder, SegmentRecord
from .text_cutter import (
    AppendUtteranceText,
    EndUtterance,
    OpenUtterance,
    TextAction,
    UtteranceCutter,
    check_message,
    check_total_text,
)
from .timestamps import Timestamper, queued_responses
from .utterances import (
    UtteranceAudio,
    UtteranceDone,
    UtteranceEvent,
    UtterancePlan,
    UtteranceSequence,
    utterance_plan,
)

logger = logging.getLogger(__name__)

QUEUED_AUDIO_CHUNKS = 2
"""Most audio chunks the response queue holds for its reader (see the module doc): enough to
overlap the next chunk's arrival with sending one; the stages' own lookahead does the rest."""


@dataclass(eq=False)
class _StreamedUtterance:
    """One utterance of the streamed text: its text so far, its talker feed, its outcome."""

    index: int
    text_start: int
    seed: int
    text: str
    """Its text so far, as sent to the talker (the stream's ``[text_start, text_end)``)."""
    feed: asyncio.Queue[stages_pb2.TalkerClientMessage | None] = field(default_factory=asyncio.Queue)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False
    """Its utterance_end was sent."""
    cut: asyncio.Task[tts_pb2.TimedUnit | None] | None = None
    """With timestamps, after a cancel: its last unit sent whole (being aligned)."""
    done: UtteranceDone | None = None

    @property
    def text_end(self) -> int:
        """One past its last character in the stream's text."""
        return self.text_start + len(self.text)

    def record(self, finish_reason: int | None = None) -> SegmentRecord:
        """What the summary and its utterance_end say of it (``finish_reason``: else its own)."""
        done = self.done
        if finish_reason is None:
            finish_reason = (
                tts_pb2.FINISH_REASON_CANCELLED
                if self.cancelled.is_set()
                else (done.finish_reason if done is not None else 0)
            )
        return SegmentRecord(
            index=self.index,
            text_start=self.text_start,
            text_end=self.text_end,
            seed=self.seed,
            frames=done.frames if done is not None else 0,
            finish_reason=finish_reason,
            talker_done=done.talker_done if done is not None else stages_pb2.TalkerDone(),
        )


@dataclass(frozen=True)
class _Cancelled:
    utterances: list[_StreamedUtterance]


class _Finished:
    """Every utterance was delivered."""


_Item = UtteranceEvent | _Cancelled | _Finished | tts_pb2.SynthesizeResponse | BaseException


async def _messages_of(
    feed: asyncio.Queue[stages_pb2.TalkerClientMessage | None],
) -> AsyncIterator[stages_pb2.TalkerClientMessage]:
    while (message := await feed.get()) is not None:
        yield message


class StreamingSession:
    """One StreamingSynthesize stream after its configuration was accepted (see the module doc)."""

    def __init__(
        self,
        prepared: PreparedRequest,
        messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        request_id: str,
        *,
        sequence: UtteranceSequence,
        responses: ResponseBuilder,
        cutter: UtteranceCutter,
        max_text_chars: int,
        idle_timeout: float,
        timestamps: Callable[[asyncio.Queue[Any]], Timestamper | None] = lambda _: None,
    ) -> None:
        """``messages``: the client's messages after the configuration; ``sequence``: runs the
        utterances; ``responses``: makes every response; ``cutter``: cuts the text into
        utterances; ``max_text_chars``: the text limit over the stream; ``idle_timeout``: how long
        the text may stay open with neither a message nor audio; ``timestamps``: the stream's
        timestamper given its response queue (None: no timings)."""
        self._prepared = prepared
        self._messages = messages
        self._request_id = request_id
        self._sequence = sequence
        self._builder = responses
        self._cutter = cutter
        self._max_text_chars = max_text_chars
        self._idle_timeout = idle_timeout
        self._last_activity = time.monotonic()
        self._out: asyncio.Queue[_Item] = asyncio.Queue()
        self._audio_room = asyncio.Semaphore(QUEUED_AUDIO_CHUNKS)
        """Free audio places in ``_out``: taken by the pump, given back as the generator takes audio."""
        self._timings = timestamps(self._out)
        self._plans: asyncio.Queue[UtterancePlan | None] = asyncio.Queue()
        self._utterances: list[_StreamedUtterance] = []
        self._current: _StreamedUtterance | None = None

    async def responses(self) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """Metadata, then audio and utterance ends as they come, then the summary."""
        builder = self._builder
        yield builder.metadata()
        reader = asyncio.create_task(self._read(), name="text reader")
        pump = asyncio.create_task(self._pump(self._sequence), name="utterance events")
        try:
            while True:
                item = await self._out.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Finished):
                    break
                if isinstance(item, tts_pb2.SynthesizeResponse):  # an utterance's timings
                    yield item
                elif isinstance(item, _Cancelled):
                    for utterance in item.utterances:
                        if not utterance.ended:
                            metrics.CANCELLED_UTTERANCES.labels(stage=STAGE).inc()
                            yield await self._cancelled_end(utterance)
                elif isinstance(item, UtteranceAudio):
                    self._audio_room.release()
                    if self._utterances[item.index].cancelled.is_set():
                        continue
                    if self._timings is not None:
                        self._timings.add_audio(item.index, item.samples)
                    response = await builder.audio(item.index, item.samples)
                    self._last_activity = time.monotonic()
                    yield response
                elif isinstance(item, UtteranceDone):
                    utterance = self._utterances[item.index]
                    utterance.done = item
                    self._observe(item.talker_done)
                    # A stopped one (it may have finished as the reader saw the cancel, its end
                    # still queued) is acknowledged at the cancel marker that follows.
                    if not utterance.ended and not utterance.cancelled.is_set():
                        yield self._utterance_end(utterance, item.finish_reason)
                        if self._timings is not None:
                            self._timings.complete(utterance.index, utterance.text, utterance.text_start)
            final = await builder.finish()
            if final is not None:
                yield final
            if self._timings is not None:
                await self._timings.finish()
                for response in queued_responses(self._out):
                    yield response
            yield builder.summary([u.record() for u in self._utterances])
        finally:
            for task in (reader, pump):
                task.cancel()
            await asyncio.gather(reader, pump, return_exceptions=True)
            if self._timings is not None:
                await self._timings.close()

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
                    check_total_text(total, self._max_text_chars)
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
                self._current.text += action.text
            elif isinstance(action, EndUtterance):
                assert self._current is not None
                self._current.feed.put_nowait(stages_pb2.TalkerClientMessage(end_text=stages_pb2.EndText()))
                self._current.feed.put_nowait(None)
                self._current = None

    def _open(self, action: OpenUtterance) -> _StreamedUtterance:
        """Queue the next utterance's talker request (text open)."""
        plan = self._prepared.plan
        index = len(self._utterances)
        segment = segment_plan(plan, index, action.start, action.start + len(action.text), action.text)
        utterance = _StreamedUtterance(index, segment.start, segment.seed, action.text)
        stages = utterance_plan(segment, self._request_id, self._prepared.voice, self._prepared.output_plan)
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
            if self._timings is not None:  # its audio fed so far is all it sent
                utterance.cut = self._timings.cut(utterance.index, utterance.text, utterance.text_start)
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
                    if isinstance(event, UtteranceAudio) and not await self._room_for(event):
                        continue
                    self._out.put_nowait(event)
            self._out.put_nowait(_Finished())
        except Exception as exc:  # noqa: BLE001 - reported in order by responses()
            self._out.put_nowait(exc)

    async def _room_for(self, audio: UtteranceAudio) -> bool:
        """Wait for a place for ``audio`` in the response queue (backpressure); False, holding
        none, if its utterance was stopped (before or while waiting): drop it."""
        cancelled = self._utterances[audio.index].cancelled
        if cancelled.is_set():
            return False
        await self._audio_room.acquire()
        if cancelled.is_set():
            self._audio_room.release()
            return False
        return True

    # --- responses ------------------------------------------------------------------------
    def _utterance_end(self, utterance: _StreamedUtterance, reason: int) -> tts_pb2.SynthesizeResponse:
        utterance.ended = True
        return self._builder.utterance_end(utterance.record(reason))

    async def _cancelled_end(self, utterance: _StreamedUtterance) -> tts_pb2.SynthesizeResponse:
        """A cancelled utterance's acknowledgement; with timestamps, naming the last unit of
        its audio sent whole."""
        last = await utterance.cut if utterance.cut is not None else None
        if self._timings is not None:
            self._timings.discard(utterance.index)
        response = self._utterance_end(utterance, tts_pb2.FINISH_REASON_CANCELLED)
        if last is not None:
            response.utterance_end.last_unit.CopyFrom(last)
        return response

    @staticmethod
    def _observe(done: stages_pb2.TalkerDone) -> None:
        metrics.TEXT_WAIT_TIME.labels(stage=STAGE).observe(done.text_wait_ms / 1000)
        if done.stalled_frames:
            metrics.STALLED_FRAMES.labels(stage=STAGE).inc(done.stalled_frames)


__all__ = ["QUEUED_AUDIO_CHUNKS", "StreamingSession"]
