"""Word (or character) timings of a synthesis stream (``SynthesizeRequest.timestamps``):
:class:`Timestamper`, one per stream that asks for them.

Off the audio path. The stream hands the timestamper each utterance's native PCM as it feeds it
to the response builder (:meth:`Timestamper.add_audio`: a reference, no copy) and says when an
utterance is complete (:meth:`Timestamper.complete`); that starts a task that sends the
utterance's audio and text to the aligner stage and puts the ``timestamps`` response into the
stream's queue when the answer comes, where it goes out between later audio. Nothing the audio
path does ever waits for an alignment, except the end of the stream: :meth:`Timestamper.finish`
awaits the pending ones before the summary.

Positions. The aligner answers in milliseconds of the utterance's native audio and in code
points of the text it was sent; a unit's start and end become native sample offsets (clamped to
the utterance's audio, made non-decreasing) mapped to the output as sent by the stream's
:class:`~gateway.synthesis.responses.ResponseBuilder` (``output_sample``: resampling, ``speed``,
the utterances before it), and its span is moved by the utterance's place in the request's (or
the streamed) text.

Failure. An aligner that fails, is unreachable, refuses the audio or answers spans outside the
text never fails the stream: the utterance's ``timestamps`` message carries ``error`` and no
units (logged as a warning), so a client always gets exactly one message per utterance with
audio. An unexpected failure's ``error`` names the request id only, as an INTERNAL status does.

Barge-in. A cancelled utterance's audio sent so far is aligned, from the moment of the cancel,
with the text it had received (:meth:`Timestamper.cut`): the last unit that ends before the audio
stops is the last one sent whole, named by its ``utterance_end`` (which waits for it at most
:data:`CUT_ALIGN_WAIT_S` from the cancel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np

from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..stages.aligner import AlignerStage
from ..stages.errors import StageError
from .responses import ResponseBuilder
from .utterances import UtteranceEvent

logger = logging.getLogger(__name__)

CUT_ALIGN_WAIT_S = 1.0
"""Longest a cancelled utterance's acknowledgement waits for the alignment of its sent audio."""

_ALIGN_UNITS = {
    tts_pb2.TIMESTAMP_UNIT_WORD: stages_pb2.ALIGN_UNIT_WORD,
    tts_pb2.TIMESTAMP_UNIT_CHARACTER: stages_pb2.ALIGN_UNIT_CHARACTER,
}


class AlignmentError(ValueError):
    """An aligner answer that does not fit its request (spans outside the text)."""


def check_timestamps(unit: int, aligner: AlignerStage | None) -> bool:
    """Whether a request asks for timestamps (``unit``: its ``timestamps`` field):
    INVALID_ARGUMENT for an unknown value, FAILED_PRECONDITION without an aligner stage."""
    if unit == tts_pb2.TIMESTAMP_UNIT_UNSPECIFIED:
        return False
    if unit not in _ALIGN_UNITS:
        names = ", ".join(tts_pb2.TimestampUnit.keys())
        raise InvalidRequestError(f"timestamps: unknown value {unit} (one of {names})")
    if aligner is None:
        raise FailedPreconditionError(
            "this server has no aligner stage: timestamps need the gateway to run with --aligner-targets "
            "(ModelInfo.timestamps_supported)"
        )
    return True


def timed_units(
    reply: stages_pb2.AlignResponse,
    text: str,
    text_start: int,
    native_samples: int,
    sample_rate: int,
    place: Callable[[int], int],
) -> list[tts_pb2.TimedUnit]:
    """The aligner's ``reply`` for one utterance (``text``, at ``text_start`` of the request's
    text; ``native_samples`` of audio at ``sample_rate``) as public units: spans moved to the
    request's text, times to native sample offsets (clamped to the audio, non-decreasing) and
    through ``place`` (native offset -> sample of the output as sent). AlignmentError for a span
    outside ``text`` or spans out of order."""
    units: list[tts_pb2.TimedUnit] = []
    start = end = 0
    char_end = 0
    for unit in reply.units:
        if not 0 <= unit.char_start <= unit.char_end <= len(text) or unit.char_start < char_end:
            raise AlignmentError(
                f"aligner unit {unit.text!r} spans [{unit.char_start}, {unit.char_end}) of a "
                f"{len(text)}-character text (after {char_end})"
            )
        char_end = unit.char_end
        start = min(max(_native(unit.start_ms, sample_rate), start, end), native_samples)
        end = min(max(_native(unit.end_ms, sample_rate), start), native_samples)
        units.append(
            tts_pb2.TimedUnit(
                text=unit.text,
                char_start=text_start + unit.char_start,
                char_end=text_start + unit.char_end,
                start_sample=place(start),
                end_sample=place(end),
            )
        )
    return units


def _native(ms: float, sample_rate: int) -> int:
    """A time in milliseconds as a native sample offset (NaN and negatives: 0)."""
    if not ms > 0:
        return 0
    return round(min(ms, 1e12) * sample_rate / 1000)


class Timestamper:
    """The timings of one stream's utterances (see the module doc)."""

    def __init__(
        self,
        aligner: AlignerStage,
        unit: int,
        language: str,
        builder: ResponseBuilder,
        ready: asyncio.Queue[Any],
        request_id: str,
        *,
        sample_rate: int,
        time_remaining: float | None = None,
    ) -> None:
        """``unit``: the request's ``timestamps`` (WORD or CHARACTER); ``language``: its
        language as planned ("auto" for none), sent as is (the aligner's word split reads it);
        ``builder``: the stream's response builder (where utterances are); ``ready``: the
        stream's response queue, which gets each ``timestamps`` response; ``sample_rate``: the
        native rate of the audio; ``time_remaining``: the client's deadline, in seconds from now
        (None: none)."""
        self.aligner = aligner
        self.unit = unit
        self.language = language
        self.builder = builder
        self.ready = ready
        self.request_id = request_id
        self.sample_rate = sample_rate
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self._audio: dict[int, list[np.ndarray]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add_audio(self, index: int, samples: np.ndarray) -> None:
        """Utterance ``index``'s next native PCM, exactly as fed to the builder."""
        self._audio.setdefault(index, []).append(samples)

    def complete(self, index: int, text: str, text_start: int) -> None:
        """Utterance ``index`` (``text``, at ``text_start``) has all its audio: align it in a
        task whose response goes to the ready queue (none for an utterance without audio)."""
        pieces = self._audio.pop(index, [])
        if not pieces:
            return
        task = asyncio.create_task(
            self._align(index, np.concatenate(pieces), text, text_start), name=f"align {index}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cut(self, index: int, text: str, text_start: int) -> asyncio.Task[tts_pb2.TimedUnit | None]:
        """Utterance ``index`` was cancelled (barge-in) with the audio fed so far: a task whose
        result is its last unit sent whole (see the module doc); None if none was, or the
        alignment failed or took longer than :data:`CUT_ALIGN_WAIT_S`. Started at the cancel,
        so the acknowledgement waits as little as it can."""
        # A copy: an utterance that completed as it was cancelled still gets its timings.
        task = asyncio.create_task(
            self._last_unit(index, list(self._audio.get(index, [])), text, text_start),
            name=f"align {index} cut",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def discard(self, index: int) -> None:
        """Utterance ``index`` gets no ``timestamps`` message (cancelled): forget its audio."""
        self._audio.pop(index, None)

    async def _last_unit(
        self, index: int, pieces: list[np.ndarray], text: str, text_start: int
    ) -> tts_pb2.TimedUnit | None:
        if not pieces or not text.strip():
            return None
        samples = np.concatenate(pieces)
        try:
            units = await asyncio.wait_for(self._units(index, samples, text, text_start), CUT_ALIGN_WAIT_S)
        except (Exception, asyncio.TimeoutError) as exc:  # noqa: BLE001 - the audio goes on
            logger.warning("utterance %d: aligning the audio sent before the cancel failed: %s", index, exc)
            return None
        whole = [u for u in units if u.end_sample < self.builder.output_sample(index, samples.size)]
        return whole[-1] if whole else None

    async def finish(self) -> None:
        """Await every pending alignment: their responses are in the ready queue when this
        returns (:func:`queued_responses`)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop every pending alignment (the stream ended early)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _units(
        self, index: int, samples: np.ndarray, text: str, text_start: int
    ) -> list[tts_pb2.TimedUnit]:
        """Utterance ``index``'s units (``text``, at ``text_start``) timed by the aligner in
        ``samples`` (its native audio from its start) and placed in the output as sent."""
        reply = await self.aligner.align(
            samples,
            self.sample_rate,
            text,
            self.language,
            _ALIGN_UNITS[self.unit],
            self.request_id,
            None if self._deadline is None else self._deadline - time.monotonic(),
        )
        return timed_units(
            reply,
            text,
            text_start,
            samples.size,
            self.sample_rate,
            lambda offset: self.builder.output_sample(index, offset),
        )

    async def _align(self, index: int, samples: np.ndarray, text: str, text_start: int) -> None:
        message = tts_pb2.Timestamps(index=index, unit=self.unit)
        try:
            message.units.extend(await self._units(index, samples, text, text_start))
        except Exception as exc:  # an aligner failure never fails the audio
            # StageError and AlignmentError messages are written for clients (a StageError's
            # details are logged where it is raised); anything else is a bug: only the log has it.
            told = isinstance(exc, StageError | AlignmentError)
            logger.warning("utterance %d: no timestamps: %s", index, exc, exc_info=not told)
            message.error = str(exc) if told else _internal_error(self.request_id)
        self.ready.put_nowait(tts_pb2.SynthesizeResponse(timestamps=message))


def _internal_error(request_id: str) -> str:
    where = f" (request id {request_id})" if request_id else ""
    return f"the alignment failed with an internal error{where}; the details are in the server log"


async def with_timings(
    events: AsyncIterator[UtteranceEvent], queue: asyncio.Queue[Any]
) -> AsyncIterator[UtteranceEvent | tts_pb2.SynthesizeResponse]:
    """``events`` merged with the ``timestamps`` responses a :class:`Timestamper` puts in
    ``queue``, each as soon as it is there.

    Pulled, not pumped: the next event is asked for only once the consumer has taken the
    previous one, so a slow client paces the stages exactly as without timestamps (the
    utterance sequence's lookahead bounds what runs ahead). While that one pending event is
    awaited, a response that becomes ready goes out at once; one that is ready before an event
    goes out first. Neither ever waits for the other: an alignment never delays audio."""
    next_event: asyncio.Task[UtteranceEvent] | None = None
    next_timing: asyncio.Task[Any] | None = None
    try:
        while True:
            while not queue.empty():
                yield queue.get_nowait()
            if next_event is None:
                next_event = asyncio.ensure_future(anext(events))
            if next_timing is None:
                next_timing = asyncio.ensure_future(queue.get())
            await asyncio.wait((next_event, next_timing), return_when=asyncio.FIRST_COMPLETED)
            if next_timing.done():
                timing, next_timing = next_timing.result(), None
                yield timing
            if next_event.done():
                finished, next_event = next_event, None
                try:
                    event = finished.result()
                except StopAsyncIteration:
                    return
                yield event
    finally:
        for task in (next_event, next_timing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def queued_responses(queue: asyncio.Queue[Any]) -> Sequence[tts_pb2.SynthesizeResponse]:
    """The responses left in a stream's queue (after :meth:`Timestamper.finish`)."""
    out = []
    while not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, tts_pb2.SynthesizeResponse):
            out.append(item)
    return out


__all__ = [
    "CUT_ALIGN_WAIT_S",
    "AlignmentError",
    "Timestamper",
    "check_timestamps",
    "queued_responses",
    "timed_units",
    "with_timings",
]
