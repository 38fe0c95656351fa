"""A text cut into talker-sized segments, for one request: how large a segment may be
(:func:`segment_size`) and the segments as they become known (:class:`Segmentation`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from tts_common.synthesis.segments import SegmentPlan, first_segment, plan_segments, request_segment_size
from tts_common.synthesis.validation import SynthesisPlan
from tts_common.text import TokenCounter

from ..stages.backend import ModelBackend
from .voice import ResolvedVoice

logger = logging.getLogger(__name__)

INLINE_SEGMENTING_CHARS = 1000
"""Texts up to this length are segmented on the event loop (about 3.5 ms per thousand characters
with a released tokenizer); longer ones in a worker thread."""


def segment_size(
    backend: ModelBackend, plan: SynthesisPlan, voice: ResolvedVoice, max_seq_len: int, configured: int
) -> tuple[int, TokenCounter]:
    """The most text tokens one talker request of this request may take (the segment size its
    prompt leaves room for, at most ``configured`` unless 0), and the token counter (the model's
    talker's tokenizer) they are counted with."""
    count = backend.tokens.counter()
    size = request_segment_size(
        count,
        plan,
        ref_text=voice.ref_text,
        ref_codes=voice.ref_codes,
        max_seq_len=max_seq_len,
        configured=configured,
    )
    return size, count


class Segmentation:
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
    async def start(cls, plan: SynthesisPlan, max_tokens: int, count: TokenCounter) -> Segmentation:
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


__all__ = ["INLINE_SEGMENTING_CHARS", "Segmentation", "segment_size"]
