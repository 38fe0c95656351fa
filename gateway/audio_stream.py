"""The audio part of a synthesis response: PCM chunks in, encoded ``AudioChunk`` responses out,
with the per-request statistics of the final ``SynthesisSummary`` and the gateway metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

from .config import STAGE
from .encoding import AudioOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputPlan:
    """How a request's audio is returned (resolved: never UNSPECIFIED, never 0)."""

    encoding: int
    sample_rate: int
    first_chunk_frames: int
    max_chunk_frames: int


class AudioStream:
    """Turns PCM chunks into AudioChunk responses and keeps the per-request statistics."""

    def __init__(self, plan: OutputPlan, output: AudioOutput, received: float) -> None:
        self.plan = plan
        self.output = output
        self.received = received
        self.index = 0
        self.num_samples = 0
        self.first_audio_at: float | None = None
        self.last_chunk_at: float | None = None

    async def _run(self, fn: Callable[..., tuple[bytes, int]], *args: Any) -> tuple[bytes, int]:
        # Codecs, resampling and time-scaling take real CPU time: keep the event loop free.
        if self.output.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _response(self, data: bytes, n: int) -> tts_pb2.SynthesizeResponse:
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
            metrics.TIME_TO_FIRST_AUDIO.labels(stage=STAGE).observe(now - self.received)
        elif self.last_chunk_at is not None:
            metrics.INTER_CHUNK_LATENCY.labels(stage=STAGE).observe(now - self.last_chunk_at)
        self.last_chunk_at = now
        chunk = tts_pb2.AudioChunk(
            data=data,
            sample_rate=self.plan.sample_rate,
            encoding=self.plan.encoding,
            index=self.index,
            start_sample=self.num_samples,
            num_samples=n,
        )
        self.index += 1
        self.num_samples += n
        if n:
            metrics.AUDIO_SECONDS.labels(stage=STAGE).inc(n / self.plan.sample_rate)
        return tts_pb2.SynthesizeResponse(audio=chunk)

    async def chunk(self, samples: np.ndarray) -> tts_pb2.SynthesizeResponse:
        """The response carrying the next PCM chunk (float32, native rate)."""
        data, n = await self._run(self.output.process, samples)
        return self._response(data, n)

    async def finish(self) -> tts_pb2.SynthesizeResponse | None:
        """The last chunk (resampler tail, encoder trailer), if there is anything left."""
        data, n = await self._run(self.output.finish)
        if not data and not n:
            return None
        return self._response(data, n)

    def summary(self, done: stages_pb2.TalkerDone) -> tts_pb2.SynthesisSummary:
        """The final statistics (logged, and counted in the metrics)."""
        total = time.monotonic() - self.received
        audio_seconds = self.num_samples / self.plan.sample_rate
        rtf = total / audio_seconds if audio_seconds > 0 else 0.0
        if audio_seconds > 0:
            metrics.REAL_TIME_FACTOR.labels(stage=STAGE).observe(rtf)
        ttfa = (self.first_audio_at - self.received) * 1000 if self.first_audio_at is not None else 0.0
        logger.info(
            "done: %d frames, %.2f s audio in %d chunks, first audio %.0f ms, total %.0f ms, rtf %.3f, %s",
            done.frames,
            audio_seconds,
            self.index,
            ttfa,
            total * 1000,
            rtf,
            tts_pb2.FinishReason.Name(done.finish_reason),
        )
        return tts_pb2.SynthesisSummary(
            frames=done.frames,
            num_samples=self.num_samples,
            audio_seconds=audio_seconds,
            time_to_first_audio_ms=ttfa,
            total_ms=total * 1000,
            rtf=rtf,
            finish_reason=done.finish_reason,
            num_chunks=self.index,
            queue_ms=done.queue_ms,
        )
