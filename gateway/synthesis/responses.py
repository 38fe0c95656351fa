"""Every response of a synthesis stream, unary (Synthesize) and streamed (StreamingSynthesize)
alike: :class:`ResponseBuilder`, the one object that turns the utterances' PCM into audio
chunks, and that says where each utterance is in the audio sent.

Positions. The stages produce PCM at the model's native rate; the client gets it time-scaled
(``speed``), resampled (``output.sample_rate``) and encoded
(:class:`~gateway.encoding.AudioOutput`). The builder feeds each utterance's native samples to
that output chain in order, and keeps each utterance's *native span* (where its samples lie among
all native samples fed). :meth:`ResponseBuilder.output_position` maps a native position to the
output as sent: the output chain's exact length function (``AudioOutput.output_length``), so the
span of utterance k in the output is ``[output_position(start_k), output_position(end_k))``, the
spans of consecutive utterances meet, and the last ends at the stream's total, exactly: every
summary's segments and every ``utterance_end`` tile the samples sent. Anything later that speaks
of a moment of an utterance (word timings of an aligner) maps its native sample offset with
:meth:`ResponseBuilder.output_sample` the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..config import STAGE
from ..encoding import AudioOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputPlan:
    """How a request's audio is returned (resolved: never UNSPECIFIED, never 0)."""

    encoding: int
    sample_rate: int
    first_chunk_frames: int
    max_chunk_frames: int


@dataclass(frozen=True)
class OutputSpan:
    """Samples ``[start_sample, start_sample + num_samples)`` of the output as sent."""

    start_sample: int
    num_samples: int


@dataclass(frozen=True)
class SegmentRecord:
    """What a summary says of one utterance (a segment of a long text, or an utterance of
    streamed text) besides its audio, which the builder knows."""

    index: int
    text_start: int
    text_end: int
    seed: int
    frames: int
    """Codec frames whose audio was delivered."""
    finish_reason: int
    talker_done: stages_pb2.TalkerDone


def overall_finish_reason(reasons: Sequence[int]) -> int:
    """The finish reason of a whole stream from its utterances' (cancelled ones left out by the
    caller): LENGTH if any hit its budget, else SILENCE if the silence stop ended any, else EOS."""
    for reason in (tts_pb2.FINISH_REASON_LENGTH, tts_pb2.FINISH_REASON_SILENCE):
        if reason in reasons:
            return reason
    return tts_pb2.FINISH_REASON_EOS


class ResponseBuilder:
    """The responses of one synthesis stream and where its utterances are (see the module doc).
    Feed it in stream order: an utterance's audio only after every earlier utterance's."""

    def __init__(
        self,
        metadata: tts_pb2.SynthesisMetadata,
        plan: OutputPlan,
        output: AudioOutput,
        received: float,
        *,
        model: str = "",
    ) -> None:
        """``metadata``: the stream's first message; ``output``: its output chain (whose input
        rate is the native rate); ``received``: when the request arrived (monotonic clock);
        ``model``: the served model's name (metrics, logs)."""
        self._metadata = metadata
        self.plan = plan
        self.output = output
        self.received = received
        self.model = model
        self.chunks = 0
        """Audio chunks made so far."""
        self.num_samples = 0
        """Output samples sent so far."""
        self.native_samples = 0
        """Native samples fed to the output chain so far."""
        self.first_audio_at: float | None = None
        self.last_chunk_at: float | None = None
        self._spans: dict[int, list[int]] = {}

    # --- where utterances are ---------------------------------------------------------------
    def output_position(self, native_position: int) -> int:
        """Where native sample ``native_position`` (counted over every utterance fed) lands in
        the output as sent; the stream's total at the end: ``output_position(native_samples)``."""
        return self.output.output_length(native_position)

    def native_span(self, index: int) -> tuple[int, int]:
        """Utterance ``index``'s native samples fed so far: ``(start, end)`` positions (an
        utterance not yet begun starts where the audio fed so far ends)."""
        span = self._spans.get(index)
        return (span[0], span[1]) if span is not None else (self.native_samples, self.native_samples)

    def utterance_span(self, index: int) -> OutputSpan:
        """Utterance ``index``'s samples in the output as sent."""
        start, end = self.native_span(index)
        first = self.output_position(start)
        return OutputSpan(first, self.output_position(end) - first)

    def output_sample(self, index: int, native_offset: int) -> int:
        """Where sample ``native_offset`` of utterance ``index``'s own audio lands in the output
        as sent (absolute across utterances)."""
        return self.output_position(self.native_span(index)[0] + native_offset)

    def end_utterance(self, index: int) -> None:
        """Utterance ``index`` gets no more audio: one that had none is placed here."""
        self._spans.setdefault(index, [self.native_samples, self.native_samples])

    # --- responses --------------------------------------------------------------------------
    def metadata(self) -> tts_pb2.SynthesizeResponse:
        """The stream's first response."""
        return tts_pb2.SynthesizeResponse(metadata=self._metadata)

    async def audio(self, index: int, samples: np.ndarray) -> tts_pb2.SynthesizeResponse:
        """The response carrying utterance ``index``'s next PCM (float32, native rate)."""
        span = self._spans.setdefault(index, [self.native_samples, self.native_samples])
        if span[1] != self.native_samples:
            raise RuntimeError(f"utterance {index}'s audio fed after a later utterance's")
        self.native_samples += int(samples.size)
        span[1] = self.native_samples
        data, n = await self._run(self.output.process, samples)
        return self._chunk(data, n)

    async def finish(self) -> tts_pb2.SynthesizeResponse | None:
        """The last chunk (resampler and time-scale tails, encoder trailer), if anything is left."""
        data, n = await self._run(self.output.finish)
        if not data and not n:
            return None
        return self._chunk(data, n)

    def utterance_end(self, record: SegmentRecord) -> tts_pb2.SynthesizeResponse:
        """StreamingSynthesize's end of one utterance (its span as sent, its talker's figures)."""
        self.end_utterance(record.index)
        span = self.utterance_span(record.index)
        done = record.talker_done
        return tts_pb2.SynthesizeResponse(
            utterance_end=tts_pb2.UtteranceEnd(
                index=record.index,
                text_start=record.text_start,
                text_end=record.text_end,
                start_sample=span.start_sample,
                num_samples=span.num_samples,
                finish_reason=record.finish_reason,
                seed=record.seed,
                text_wait_ms=done.text_wait_ms,
                stalled_frames=done.stalled_frames,
            )
        )

    def summary(self, records: Sequence[SegmentRecord]) -> tts_pb2.SynthesizeResponse:
        """The last response: the totals and every segment (``records`` in order), each
        segment's span as sent, the last ending at the total sent (call after :meth:`finish`)."""
        for record in records:
            self.end_utterance(record.index)
        starts = [min(self.output_position(self.native_span(r.index)[0]), self.num_samples) for r in records]
        ends = [*starts[1:], self.num_samples]
        spoken = [r.finish_reason for r in records if r.finish_reason != tts_pb2.FINISH_REASON_CANCELLED]
        summary = self._totals(
            frames=sum(r.frames for r in records),
            finish_reason=overall_finish_reason(spoken),
            queue_ms=records[0].talker_done.queue_ms if records else 0.0,
        )
        summary.num_segments = len(records)
        summary.length_segments.extend(
            r.index for r in records if r.finish_reason == tts_pb2.FINISH_REASON_LENGTH
        )
        for record, start, end in zip(records, starts, ends):
            summary.segments.append(
                tts_pb2.SegmentSummary(
                    index=record.index,
                    text_start=record.text_start,
                    text_end=record.text_end,
                    seed=record.seed,
                    start_sample=start,
                    num_samples=max(end - start, 0),
                    frames=record.frames,
                    finish_reason=record.finish_reason,
                )
            )
            summary.text_wait_ms += record.talker_done.text_wait_ms
            summary.stalled_frames += record.talker_done.stalled_frames
        return tts_pb2.SynthesizeResponse(summary=summary)

    # --- internals ----------------------------------------------------------------------------
    async def _run(self, fn: Callable[..., tuple[bytes, int]], *args: Any) -> tuple[bytes, int]:
        # Codecs, resampling and time-scaling take real CPU time: keep the event loop free.
        if self.output.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _chunk(self, data: bytes, n: int) -> tts_pb2.SynthesizeResponse:
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
            metrics.TIME_TO_FIRST_AUDIO.labels(stage=STAGE).observe(now - self.received)
            metrics.MODEL_TIME_TO_FIRST_AUDIO.labels(stage=STAGE, model=self.model).observe(
                now - self.received
            )
        elif self.last_chunk_at is not None:
            metrics.INTER_CHUNK_LATENCY.labels(stage=STAGE).observe(now - self.last_chunk_at)
        self.last_chunk_at = now
        chunk = tts_pb2.AudioChunk(
            data=data,
            sample_rate=self.plan.sample_rate,
            encoding=self.plan.encoding,
            index=self.chunks,
            start_sample=self.num_samples,
            num_samples=n,
        )
        self.chunks += 1
        self.num_samples += n
        if n:
            seconds = n / self.plan.sample_rate
            metrics.AUDIO_SECONDS.labels(stage=STAGE).inc(seconds)
            metrics.MODEL_AUDIO_SECONDS.labels(stage=STAGE, model=self.model).inc(seconds)
        return tts_pb2.SynthesizeResponse(audio=chunk)

    def _totals(self, *, frames: int, finish_reason: int, queue_ms: float) -> tts_pb2.SynthesisSummary:
        """The stream's statistics (logged, and counted in the metrics)."""
        total = time.monotonic() - self.received
        audio_seconds = self.num_samples / self.plan.sample_rate
        rtf = total / audio_seconds if audio_seconds > 0 else 0.0
        if audio_seconds > 0:
            metrics.REAL_TIME_FACTOR.labels(stage=STAGE).observe(rtf)
        ttfa = (self.first_audio_at - self.received) * 1000 if self.first_audio_at is not None else 0.0
        logger.info(
            "done: model %s, %d frames, %.2f s audio in %d chunks, first audio %.0f ms, total %.0f ms, rtf %.3f, %s",
            self.model or "-",
            frames,
            audio_seconds,
            self.chunks,
            ttfa,
            total * 1000,
            rtf,
            tts_pb2.FinishReason.Name(finish_reason),
        )
        return tts_pb2.SynthesisSummary(
            frames=frames,
            num_samples=self.num_samples,
            audio_seconds=audio_seconds,
            time_to_first_audio_ms=ttfa,
            total_ms=total * 1000,
            rtf=rtf,
            finish_reason=finish_reason,
            num_chunks=self.chunks,
            queue_ms=queue_ms,
        )


__all__ = [
    "OutputPlan",
    "OutputSpan",
    "ResponseBuilder",
    "SegmentRecord",
    "overall_finish_reason",
]
