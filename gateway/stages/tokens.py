"""Counting text tokens in the gateway, for cutting long texts into talker-sized segments.

Exact counts need the checkpoint's tokenizer. The gateway has no checkpoint, so it asks the talker
for its tokenizer files once (``Talker.GetTokenizer``) and builds the same tokenizer
(``tts_common.text.tokenizer``). Until that succeeds (a talker without the RPC, or unreachable at
that moment) segments are packed with ``tts_common.text.estimate_tokens``, a deliberately high
estimate, and the fetch is retried in the background at most once per ``retry_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.text import TokenCounter, estimate_tokens
from tts_common.text.tokenizer import TextTokenizer, TokenizerError

from .routing import StageClient

logger = logging.getLogger(__name__)


class TalkerTokenCounter:
    """The talker's tokenizer as a :data:`~tts_common.text.TokenCounter` (see the module doc)."""

    def __init__(
        self,
        talker: StageClient[stages_pb2_grpc.TalkerStub],
        *,
        timeout_seconds: float,
        retry_seconds: float,
    ) -> None:
        self._talker = talker
        self._timeout = timeout_seconds
        self._retry = retry_seconds
        self._tokenizer: TextTokenizer | None = None
        self._attempted_at: float | None = None
        self._fetch: asyncio.Task[bool] | None = None

    @property
    def exact(self) -> bool:
        """Whether counts come from the talker's tokenizer (else from the estimate)."""
        return self._tokenizer is not None

    async def load(self) -> bool:
        """Fetch the talker's tokenizer (at startup and for retries); False, logged, on failure."""
        self._attempted_at = time.monotonic()
        try:
            with self._talker.lease() as endpoint:
                reply: stages_pb2.TokenizerFiles = await endpoint.stub.GetTokenizer(
                    stages_pb2.GetTokenizerRequest(), timeout=self._timeout
                )
            # Building parses a few MB of JSON: off the event loop.
            tokenizer = await asyncio.to_thread(TextTokenizer.from_files, dict(reply.files), "the talker's")
        except (grpc.aio.AioRpcError, TokenizerError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            logger.warning(
                "no tokenizer from the talker (%s): long texts are cut by estimated token counts", detail
            )
            return False
        self._tokenizer = tokenizer
        logger.info("text tokens are counted with the talker's tokenizer")
        return True

    def counter(self) -> TokenCounter:
        """The exact counter, or the estimate; in the latter case a new fetch starts in the
        background when one is due (a request never waits for it)."""
        if self._tokenizer is not None:
            return self._tokenizer.count_tokens
        due = self._attempted_at is None or time.monotonic() - self._attempted_at >= self._retry
        if due and (self._fetch is None or self._fetch.done()):
            self._attempted_at = time.monotonic()
            self._fetch = asyncio.create_task(self.load(), name="talker tokenizer")
        return estimate_tokens

    async def close(self) -> None:
        """Stop a fetch still running."""
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetch


__all__ = ["TalkerTokenCounter"]
