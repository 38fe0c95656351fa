"""The text side of StreamingSynthesize: the client's messages checked in order
(:func:`read_config`, :func:`check_message`) and the streamed text cut into utterances
(:class:`UtteranceCutter`), independent of the transport (gRPC and the WebSocket share it).

Utterances. The text between two ``flush`` markers (or the stream's start and end) is one
utterance unless it would outgrow one talker request (``max_tokens``: the segment size of
``tts_common.synthesis.segments``); then it is cut, never truncated. Text reaches the talker as
early as the cut rule allows:

* A sentence that begins while the utterance holds at most half a segment of tokens (the eager
  zone) is forwarded as it arrives, all but a partial last word (the talker could not tokenize
  that yet anyway: its token may still change), so the talker speaks the first words while the
  rest is written.
* A later sentence is forwarded once complete (``tts_common.text.IncrementalSentenceSplitter``)
  if it still fits the utterance; the first that does not starts the next utterance. The talker
  reads one text token per frame (80 ms), so it is well ahead by then and rarely waits for it.
* A sentence begun in the eager zone that outgrows the utterance is cut before its last word
  that does not fit (a sentence longer than a segment likewise); the rest starts the next one.
* A cut falls where the next sentence (or word) begins: the whitespace before it ends the
  earlier utterance. Punctuation is never cut off alone: it stays with the utterance before,
  even where that takes it a token or two over the size (the talker then caps the frame budget
  to its slot).

Each decision depends on the text only, never on its split into deltas or their timing (a
property test pins this). For a text that fits one utterance, the talker gets exactly the
client's text, so its audio is that of one Synthesize of the text with streaming text feeding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.text import IncrementalSentenceSplitter, TokenCounter, has_speakable_text, segment_text
from tts_common.text.chars import is_speakable, is_wide


@dataclass(frozen=True)
class OpenUtterance:
    """Start the next utterance with ``text`` (its talker request, text still open)."""

    text: str
    start: int
    """Offset of ``text`` in the stream's text (code points)."""


@dataclass(frozen=True)
class AppendUtteranceText:
    """More text for the open utterance."""

    text: str


@dataclass(frozen=True)
class EndUtterance:
    """The open utterance's text is complete."""


TextAction = OpenUtterance | AppendUtteranceText | EndUtterance


class UtteranceCutter:
    """Streamed text -> utterance actions (see the module doc). ``push`` / ``flush`` return what
    to send to the talker, in order; ``cancel`` drops the current utterance."""

    def __init__(self, max_tokens: int, count_tokens: TokenCounter) -> None:
        """``max_tokens``: most text tokens of one utterance, as ``count_tokens`` counts them."""
        self._size = max_tokens
        self._eager_tokens = max(max_tokens // 2, 1)
        self._count = count_tokens
        self._reset(0)

    def _reset(self, offset: int) -> None:
        self._start = offset
        """Stream offset of the current utterance's first character."""
        self._buffer = ""
        """The current utterance's text received so far (sent and held)."""
        self._sent = 0
        """Characters of ``_buffer`` sent to the talker."""
        self._open = False
        self._last_end = offset
        """Stream offset of the end of the utterance's last complete sentence (its start if none):
        the sentence being written begins after it (and the whitespace that follows it)."""
        self._splitter = IncrementalSentenceSplitter()
        self._splitter_base = offset
        self._ends: list[int] = []
        """Stream offsets of the sentence ends known."""
        self._points: list[int] = []
        """Stream offsets up to which text may be forwarded at once: after a whitespace
        character, after a Han/kana character, at a sentence end."""
        self._word_starts: list[int] = []
        """Stream offsets where a word (or a Han/kana character) begins after a break: where an
        utterance may be cut inside a sentence (never before punctuation: the rest would have
        nothing to speak)."""
        self._scanned = offset
        """Stream offset up to which the text was scanned for those."""

    @property
    def is_open(self) -> bool:
        """Whether an utterance's talker request has been opened and not ended."""
        return self._open

    @property
    def offset(self) -> int:
        """Characters of the stream's text received so far."""
        return self._start + len(self._buffer)

    def push(self, delta: str) -> list[TextAction]:
        """Add the next delta of the text."""
        new_ends = [self._splitter_base + s.end for s in self._splitter.push(delta)]
        self._buffer += delta
        self._scan(new_ends)
        actions: list[TextAction] = []
        self._advance(actions)
        return actions

    def flush(self) -> list[TextAction]:
        """The text so far is complete: end the current utterance (if it had nothing to speak,
        that text is dropped)."""
        self._scan([self._splitter_base + s.end for s in self._splitter.finish()])
        actions: list[TextAction] = []
        self._advance(actions)
        if self._open:
            self._send(actions, len(self._buffer))
            actions.append(EndUtterance())
        self._reset(self.offset)
        return actions

    def cancel(self) -> None:
        """Drop the current utterance and the text held for it (the caller stops its talker
        request); later text starts a new utterance."""
        self._reset(self.offset)

    # --- internals --------------------------------------------------------------------------
    def _scan(self, new_ends: list[int]) -> None:
        self._ends.extend(new_ends)
        text, base = self._buffer, self._start
        points = set(new_ends)
        for i in range(max(self._scanned - base, 0), len(text)):
            ch = text[i]
            if ch.isspace() or is_wide(ch):
                points.add(base + i + 1)
            if i > 0 and is_speakable(ch) and (text[i - 1].isspace() or is_wide(text[i - 1])):
                self._word_starts.append(base + i)
        self._scanned = base + len(text)
        self._points = sorted({*self._points, *points})

    def _tokens(self, end: int) -> int:
        """Text tokens of the utterance's text up to stream offset ``end``."""
        return self._count(self._buffer[: end - self._start])

    def _next_start(self, end: int) -> int | None:
        """Where the text after the sentence end ``end`` begins (after its whitespace); None
        while only whitespace has arrived after it."""
        rest = self._buffer[end - self._start :]
        stripped = rest.lstrip()
        return None if not stripped else end + len(rest) - len(stripped)

    def _send(self, actions: list[TextAction], end: int) -> None:
        """Send ``_buffer[:end]`` (``end`` relative; opening the utterance if needed)."""
        if not self._open:
            actions.append(OpenUtterance(self._buffer[:end], self._start))
            self._open = True
        elif end > self._sent:
            actions.append(AppendUtteranceText(self._buffer[self._sent : end]))
        self._sent = max(self._sent, end)

    def _cut(self, actions: list[TextAction], at: int) -> None:
        """End the open utterance with ``_buffer[:at]`` (sent first); the next one starts after
        ``at``, leading whitespace dropped."""
        self._send(actions, at)
        actions.append(EndUtterance())
        rest = self._buffer[at:]
        stripped = rest.lstrip()
        self._start += at + len(rest) - len(stripped)
        self._buffer = stripped
        self._sent = 0
        self._open = False
        self._last_end = self._start
        self._ends = [e for e in self._ends if e > self._start]
        self._points = [p for p in self._points if p > self._start]
        self._word_starts = [w for w in self._word_starts if w > self._start]

    def _advance(self, actions: list[TextAction]) -> None:
        while True:
            if not self._open and not has_speakable_text(self._buffer):
                return
            # Complete sentences that fit. (The whitespace after an utterance's last sentence may
            # take it one token over: the talker then caps the frame budget to its slot.)
            overflow = False
            for end in (e for e in self._ends if e > self._last_end):
                if self._tokens(end) > self._size:
                    overflow = True
                    break
                self._send(actions, max(end - self._start, self._sent))
                self._last_end = end
            # The sentence being written: forwarded as it comes if it began in the eager zone;
            # else only the whitespace after the last sentence (it belongs to this utterance).
            eager = self._tokens(self._last_end) <= self._eager_tokens
            sent = self._start + self._sent
            if eager and not overflow:
                for point in (p for p in self._points if p > sent):
                    if self._tokens(point) > self._size:
                        break
                    self._send(actions, point - self._start)
            elif self._last_end > self._start and self._open:
                after = self._next_start(self._last_end)
                self._send(actions, (self.offset if after is None else after) - self._start)
            if not overflow and self._count(self._buffer) <= self._size:
                return
            if not self._overflow(actions, eager):
                return

    def _overflow(self, actions: list[TextAction], eager: bool) -> bool:
        """The utterance's text outgrew it: cut (True), or wait for more text (False)."""
        if not eager and self._last_end > self._start:
            at = self._next_start(self._last_end)  # before the sentence that does not fit
            if at is None or not has_speakable_text(self._buffer[at - self._start :]):
                return False  # nothing to speak after the cut (yet): keep it in this utterance
            self._cut(actions, at - self._start)
            return True
        sent = self._start + self._sent
        fitting = [w for w in self._word_starts if w >= sent and self._tokens(w) <= self._size]
        if fitting and fitting[-1] > self._start:
            self._cut(actions, fitting[-1] - self._start)
            return True
        if self._sent > 0 and has_speakable_text(self._buffer[self._sent :]):
            self._cut(actions, self._sent)
            return True
        if self._sent > 0:
            return False
        # Not one word of the text fits a fresh utterance: the segmenter's error says so.
        segment_text(self._buffer, self._size, self._count)
        return False


async def read_config(
    messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
) -> tts_pb2.SynthesizeRequest:
    """The stream's first message, which must be its configuration."""
    try:
        first = await anext(messages)
    except StopAsyncIteration:
        raise InvalidRequestError(
            "the stream ended before its first message (the configuration, `config`)"
        ) from None
    kind = first.WhichOneof("message")
    if kind != "config":
        raise InvalidRequestError(
            f"the first message must be the configuration (`config`), got {_describe(kind)}"
        )
    return first.config


def check_message(message: tts_pb2.StreamingSynthesizeRequest) -> str:
    """The kind of a message after the first (``text``, ``flush`` or ``cancel``)."""
    kind = message.WhichOneof("message")
    if kind == "config":
        raise InvalidRequestError("a second configuration (`config`): it may be sent only once, first")
    if kind is None:
        raise InvalidRequestError("an empty message: set one of text, flush or cancel")
    return kind


def check_total_text(total_chars: int, max_chars: int) -> None:
    """The stream's text over all deltas stays within the text limit."""
    if total_chars > max_chars:
        raise InvalidRequestError(
            f"text is too long: {total_chars} characters so far over the stream (maximum {max_chars})"
        )


def _describe(kind: str | None) -> str:
    return "an empty message" if kind is None else f"`{kind}`"


__all__ = [
    "AppendUtteranceText",
    "EndUtterance",
    "OpenUtterance",
    "TextAction",
    "UtteranceCutter",
    "check_message",
    "check_total_text",
    "read_config",
]
