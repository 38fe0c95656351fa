"""``Synthesize``, for any transport: a whole text in, one response stream out.

The model its ``model`` names (:class:`~gateway.stages.models.ModelRegistry`; NOT_FOUND listing
the served ones) -> what this gateway can never serve refused
(:meth:`~gateway.synthesis.context.SynthesisContext.check_request`: timestamps without an
aligner stage) -> admission (:mod:`.admission`) -> validation against that model and the voice
(:func:`gateway.synthesis.request.prepare`) -> the text cut into segments
(:mod:`gateway.synthesis.segmentation`; one for a text that fits a talker request) -> the
segments as consecutive utterances (:mod:`gateway.synthesis.utterances`, each ``Talker.Generate``
piped into ``Decoder.Decode`` by :mod:`gateway.stages.pipeline`, the next one generating while
the current one streams) -> every response made by the stream's
:class:`~gateway.synthesis.responses.ResponseBuilder`: one metadata, audio chunks, one summary;
with ``timestamps``, each segment's timings (:mod:`gateway.synthesis.timestamps`) between later
chunks, as soon as they are known, all of them before the summary.
Closing the iterator (client gone, deadline) cancels every stage call; a stage failing
mid-stream raises a StageError naming the stage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tts_common.logging_setup import model_context
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..stages.models import ModelRegistry
from ..synthesis.context import SynthesisContext
from ..synthesis.responses import SegmentRecord
from ..synthesis.timestamps import queued_responses, with_timings
from ..synthesis.utterances import UtteranceAudio, UtteranceDone, UtteranceStarted
from ..voice_library import Caller
from .admission import Admission


def segment_record(done: UtteranceDone) -> SegmentRecord:
    """What the summary says of one spoken segment."""
    return SegmentRecord(
        index=done.index,
        text_start=done.plan.text_start,
        text_end=done.plan.text_end,
        seed=done.plan.talker_request.sampling.seed,
        frames=done.frames,
        finish_reason=done.finish_reason,
        talker_done=done.talker_done,
    )


@dataclass(frozen=True)
class UnarySynthesis:
    """``Synthesize`` over the served models (see the module doc)."""

    models: ModelRegistry
    context: SynthesisContext
    admission: Admission

    async def synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        *,
        caller: Caller,
        received: float,
        time_remaining: float | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """The response stream of one Synthesize request (see the module doc) made by ``caller``
        (whose registered voices it may use). ``speed``: the output's time-scale factor
        (OpenAI's ``speed``; 1.0 leaves the audio untouched)."""
        context = self.context
        backend = self.models.get(request.model)
        asks_timings = context.check_request(request)
        with model_context(backend.name), self.admission.admit(received, backend):
            prepared = await context.prepare(backend, request, request_id, time_remaining, caller=caller)
            builder = prepared.responses(request_id, received, speed)
            ready: asyncio.Queue[Any] = asyncio.Queue()
            timings = (
                context.timestamper(request, prepared, builder, ready, request_id, time_remaining)
                if asks_timings
                else None
            )
            segmentation = await context.segmentation(backend, prepared)
            sequence = context.sequence(backend, prepared, time_remaining)
            plans = context.plans(segmentation, prepared, request_id)
            try:
                async with (
                    contextlib.aclosing(sequence.events(plans)) as events,
                    contextlib.aclosing(with_timings(events, ready) if timings else events) as items,
                ):
                    async for event in items:
                        if isinstance(event, tts_pb2.SynthesizeResponse):  # a segment's timings
                            yield event
                        elif isinstance(event, UtteranceAudio):
                            if timings is not None:
                                timings.add_audio(event.index, event.samples)
                            yield await builder.audio(event.index, event.samples)
                        elif isinstance(event, UtteranceDone):
                            builder.end_utterance(event.index)
                            if timings is not None:
                                timings.complete(
                                    event.index, event.plan.talker_request.text, event.plan.text_start
                                )
                        elif isinstance(event, UtteranceStarted) and event.index == 0:
                            # A text the whole segmentation refuses is refused before any response.
                            await segmentation.complete()
                            yield builder.metadata()
                final = await builder.finish()
                if final is not None:
                    yield final
                if timings is not None:
                    await timings.finish()
                    for response in queued_responses(ready):
                        yield response
                yield builder.summary([segment_record(done) for done in sequence.results])
            finally:
                if timings is not None:
                    await timings.close()


__all__ = ["UnarySynthesis", "segment_record"]
