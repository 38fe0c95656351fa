"""A fake aligner stage for the gateway's timestamp tests: its units are the text's runs of
letters and digits (WORD; apostrophes inside a word kept) or its letters and digits one by one
(CHARACTER), spread evenly over the audio (unit k of n: ``[k, k + 1) * duration / n``), so a test
knows every timing it must see. It can hold its answers until released (``gate``), take its
time (``delay``) or fail (``fail``); it records every request."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tests.helpers.fake_stages import Harness, start_fake
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def fake_units(text: str, unit: int) -> list[tuple[str, int, int]]:
    """The fake aligner's units of ``text``: (text, char_start, char_end) in order."""
    if unit == stages_pb2.ALIGN_UNIT_CHARACTER:
        return [(c, i, i + 1) for i, c in enumerate(text) if c.isalnum()]
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def fake_times(count: int, duration_ms: float) -> list[tuple[float, float]]:
    """Unit k of ``count`` spans ``[k, k + 1) * duration_ms / count``."""
    step = duration_ms / count if count else 0.0
    return [(k * step, (k + 1) * step) for k in range(count)]


class FakeAligner(stages_pb2_grpc.AlignerServicer):
    """See the module doc."""

    def __init__(self, *, delay: float = 0.0, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.gate: asyncio.Event | None = None
        """When set to an event, every answer waits for it."""
        self.requests: list[stages_pb2.AlignRequest] = []
        self.answered = 0

    async def Align(
        self, request: stages_pb2.AlignRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.AlignResponse:
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        if self.fail:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fake aligner refuses this audio")
        duration_ms = len(request.pcm) / 4 / request.sample_rate * 1000
        units = fake_units(request.text, request.unit)
        reply = stages_pb2.AlignResponse(align_ms=1.0)
        for (text, start, end), (start_ms, end_ms) in zip(units, fake_times(len(units), duration_ms)):
            reply.units.add(text=text, char_start=start, char_end=end, start_ms=start_ms, end_ms=end_ms)
        self.answered += 1
        return reply

    async def GetStats(
        self, request: stages_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.StageStats:
        return stages_pb2.StageStats(stage="aligner", ready=True)


@contextlib.asynccontextmanager
async def serve_aligner(aligner: FakeAligner) -> AsyncIterator[str]:
    """Serve ``aligner`` on loopback; yields its target (for ``aligner_targets``)."""
    server, port = await start_fake(stages_pb2_grpc.add_AlignerServicer_to_server, aligner)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def harness_with_aligner(aligner: FakeAligner | None = None, **options: Any) -> AsyncIterator[Harness]:
    """A gateway :class:`Harness` (``options``) whose aligner stage is ``aligner`` (default: a
    plain :class:`FakeAligner`), served on loopback for as long as the harness runs."""
    async with (
        serve_aligner(aligner or FakeAligner()) as target,
        Harness(aligner_targets=(target,), **options) as h,
    ):
        yield h


__all__ = ["FakeAligner", "fake_times", "fake_units", "harness_with_aligner", "serve_aligner"]
