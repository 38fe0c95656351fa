"""Text that arrives while its request is already in the engine (incremental text input).

Two halves, one per thread:

* :class:`TextFeed` is the caller's side (any thread): ``append(delta)`` any number of times, then
  ``end()``. It only buffers and wakes the engine; misuse raises FailedPreconditionError at once.
* :class:`TextStream` is the engine thread's side: it drains the feed through the incremental
  tokenizer (:mod:`talker_service.model.streaming_text`) and holds the committed tokens until the
  request's prompt exists; from then on new tokens go straight into the prompt's trailing rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tts_common.errors import FailedPreconditionError
from tts_common.text.tokenizer import TextTokenizer, TokenizerError

from ..model.streaming_text import IncrementalTokenizer


class TextFeed:
    """The caller's handle on a request's open text (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deltas: list[str] = []
        self._ended = False
        self._wake: Callable[[], None] | None = None

    @property
    def ended(self) -> bool:
        """:meth:`end` was called."""
        with self._lock:
            return self._ended

    @property
    def unread(self) -> bool:
        """Text was appended that the engine has not taken yet."""
        with self._lock:
            return bool(self._deltas)

    def attach(self, wake: Callable[[], None]) -> None:
        """Called by the engine when the request is added: ``wake()`` after each change."""
        with self._lock:
            self._wake = wake
            pending = bool(self._deltas) or self._ended
        if pending:
            wake()

    def append(self, delta: str) -> None:
        """More text (any split, may be empty). FailedPreconditionError after :meth:`end`."""
        with self._lock:
            if self._ended:
                raise FailedPreconditionError("AppendText after EndText: the text has already ended")
            if not delta:
                return
            self._deltas.append(delta)
            wake = self._wake
        if wake is not None:
            wake()

    def end(self) -> None:
        """The text is complete. FailedPreconditionError if it already was."""
        with self._lock:
            if self._ended:
                raise FailedPreconditionError("EndText was sent twice")
            self._ended = True
            wake = self._wake
        if wake is not None:
            wake()

    def take(self) -> tuple[str, bool]:
        """(the text appended since the last call, whether the text has ended): engine thread."""
        with self._lock:
            text = "".join(self._deltas)
            self._deltas.clear()
            return text, self._ended


class TextStream:
    """The engine thread's state of one request's open text."""

    def __init__(
        self, feed: TextFeed, tokenizer: TextTokenizer, initial_text: str, tokens_to_start: int | None
    ) -> None:
        try:
            self.tokenizer = IncrementalTokenizer(tokenizer)
        except TokenizerError as exc:
            raise FailedPreconditionError(f"this checkpoint cannot take incremental text: {exc}") from exc
        self.feed = feed
        self.ended = False
        self.tokens_to_start = tokens_to_start
        """Committed tokens the prompt needs before it can be built, None = the whole text
        (:func:`~talker_service.model.prompt.tokens_to_start`, computed once per request)."""
        self.pending_ids: list[int] = self.tokenizer.push(initial_text) if initial_text else []
        """Committed tokens not yet in the prompt (all of them until the prompt is built)."""
        self._unseen = True
        """The first :meth:`pull` reports a change: the initial text is new to the engine."""

    def pull(self) -> bool:
        """Drain the feed into :attr:`pending_ids` (and :attr:`ended`); whether anything changed
        since the last call (the initial text counts as a change on the first)."""
        unseen, self._unseen = self._unseen, False
        if self.ended:
            return unseen
        text, ended = self.feed.take()
        if text:
            self.pending_ids += self.tokenizer.push(text)
        if ended:
            self.pending_ids += self.tokenizer.finish()
            self.ended = True
        return unseen or bool(text) or ended

    @property
    def can_start(self) -> bool:
        """Enough text has arrived to build the prompt (or all of it has)."""
        needed = self.tokens_to_start
        return self.ended or (needed is not None and len(self.pending_ids) >= needed)

    def take_ids(self) -> list[int]:
        """The pending tokens (now handed to the prompt)."""
        ids, self.pending_ids = self.pending_ids, []
        return ids

    @property
    def role_ids(self) -> list[int] | None:
        return self.tokenizer.role_ids


__all__ = ["TextFeed", "TextStream"]
