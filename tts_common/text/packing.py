"""Packing sentences into segments of at most a target number of text tokens (``segment_text``).

Greedy and hierarchical: sentences are packed in order while the segment still fits; a sentence
that does not fit next to the current segment starts a new one; a sentence that does not fit
even alone is cut at clause marks, and a clause that does not fit alone at word boundaries (for
Han/kana text: between characters), each level packed the same way. The last piece of a cut
sentence stays open, so the sentences after it can join it. Units with nothing speakable (a
lone "…", "* * *", a dash) are glued to the unit before them (the first one to the unit after),
so no segment is punctuation only.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tts_common.errors import InvalidRequestError
from tts_common.text.chars import (
    CJK_CLAUSE_MARKS,
    CLOSERS,
    DASHES,
    OPENING_AFTER_CJK,
    SPACED_DASHES,
    WESTERN_CLAUSE_MARKS,
    can_break_between,
    is_speakable,
    is_wide,
)
from tts_common.text.estimate import estimate_tokens
from tts_common.text.sentences import Segment, split_sentences

TokenCounter = Callable[[str], int]
"""Counts the text tokens of a string (the talker's tokenizer, or ``estimate_tokens``)."""

_Span = tuple[int, int]
_NOT_SPACE = re.compile(r"\S")
_WORD = re.compile(r"\S+")
_SHOWN_CHARS = 40  # of a too-long word, in its error message


class NothingToSpeakError(InvalidRequestError):
    """The text has no letter or digit (empty, whitespace or punctuation only)."""


class WordTooLongError(InvalidRequestError):
    """A single word (a run without spaces that cannot be cut, with any punctuation-only runs
    beside it glued on) exceeds the segment limit. ``word`` is the whole of it; the message shows
    at most its first 40 characters."""

    def __init__(self, word: str, tokens: int, limit: int) -> None:
        shown = word if len(word) <= _SHOWN_CHARS else word[: _SHOWN_CHARS - 1] + "…"
        super().__init__(
            f"the text has a word too long to synthesize: {shown!r} is {tokens} text tokens, "
            f"more than the limit of {limit} tokens per segment"
        )
        self.word = word
        self.tokens = tokens
        self.limit = limit


def has_speakable_text(text: str) -> bool:
    """Whether ``text`` has at least one letter or digit (of any script)."""
    return any(is_speakable(ch) for ch in text)


def segment_text(
    text: str,
    max_tokens: int,
    count_tokens: TokenCounter = estimate_tokens,
    *,
    single_newline_is_boundary: bool = True,
) -> list[Segment]:
    """Cut ``text`` into consecutive segments of at most ``max_tokens`` tokens each, as
    ``count_tokens`` counts them (rules: ``tts_common.text``; packing: this module).

    Each segment's ``text`` is ``text[start:end]``, stripped; only whitespace lies between
    segments. Raises NothingToSpeakError when the text has nothing to speak, WordTooLongError
    when a word alone exceeds ``max_tokens``, ValueError when ``max_tokens`` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not has_speakable_text(text):
        raise NothingToSpeakError("the text has nothing to speak (no letter or digit)")
    sentences = split_sentences(text, single_newline_is_boundary=single_newline_is_boundary)
    packer = _Packer(text, max_tokens, count_tokens)
    spans = packer.pack(_glue_unspeakable(text, [(s.start, s.end) for s in sentences]), 0)
    return [Segment(start, end, text[start:end]) for start, end in spans]


class _Packer:
    def __init__(self, text: str, max_tokens: int, count_tokens: TokenCounter) -> None:
        self._text = text
        self._max = max_tokens
        self._count = count_tokens
        # Level 0: sentences, cut into clauses; level 1: clauses, cut into words; level 2: words.
        self._splitters: tuple[Callable[[int, int], list[_Span]], ...] = (self._clauses, self._words)

    def _fits(self, start: int, end: int) -> bool:
        return self._count(self._text[start:end]) <= self._max

    def pack(self, units: list[_Span], level: int) -> list[_Span]:
        out: list[_Span] = []
        current: _Span | None = None
        for start, end in units:
            if current is not None:
                if self._fits(current[0], end):
                    current = (current[0], end)
                    continue
                out.append(current)
                current = None
            if self._fits(start, end):
                current = (start, end)
                continue
            if level == len(self._splitters):
                word = self._text[start:end]
                raise WordTooLongError(word, self._count(word), self._max)
            sub_units = _glue_unspeakable(self._text, self._splitters[level](start, end))
            pieces = self.pack(sub_units, level + 1)
            out.extend(pieces[:-1])
            current = pieces[-1]
        if current is not None:
            out.append(current)
        return out

    def _clauses(self, start: int, end: int) -> list[_Span]:
        """``text[start:end]`` cut after its clause marks (and the closers that follow them)."""
        text = self._text
        spans: list[_Span] = []
        piece_start = i = start
        while i < end:
            cut = _clause_cut(text, i, start, end)
            if cut is None:
                i += 1
                continue
            if cut < end:
                spans.append((piece_start, cut))
                nxt = _NOT_SPACE.search(text, cut, end)
                assert nxt is not None  # text[end - 1] is not a space
                piece_start = nxt.start()
            i = max(cut, i + 1)
        spans.append((piece_start, end))
        return spans

    def _words(self, start: int, end: int) -> list[_Span]:
        """The words of ``text[start:end]``: whitespace-separated, and Han/kana runs cut between
        characters (``can_break_between``)."""
        text = self._text
        spans: list[_Span] = []
        for m in _WORD.finditer(text, start, end):
            word_start = m.start()
            for i in range(m.start() + 1, m.end()):
                if can_break_between(text[i - 1], text[i]):
                    spans.append((word_start, i))
                    word_start = i
            spans.append((word_start, m.end()))
        return spans


def _clause_cut(text: str, i: int, start: int, end: int) -> int | None:
    """If a clause mark at ``i`` ends a clause, the index after it (and its closers)."""
    ch = text[i]
    if ch in CJK_CLAUSE_MARKS or ch in DASHES:
        j = i + 1
        while j < end and (text[j] in DASHES or (text[j] in CLOSERS and text[j] not in OPENING_AFTER_CJK)):
            j += 1
        return j
    if ch in SPACED_DASHES:
        spaced = i > start and text[i - 1].isspace() and i + 1 < end and text[i + 1].isspace()
        return i + 1 if spaced else None
    if ch in WESTERN_CLAUSE_MARKS or (ch == "." and i + 1 < end and text[i + 1] == "."):
        j = i + 1
        while j < end and (text[j] in WESTERN_CLAUSE_MARKS or text[j] == "." or text[j] in CLOSERS):
            j += 1
        # Before a space or a CJK character only: 1,000 / 12:30 / http://x?y=1 stay whole.
        if j < end and (text[j].isspace() or is_wide(text[j])):
            return j
    return None


def _glue_unspeakable(text: str, spans: list[_Span]) -> list[_Span]:
    """Merge every span without a letter or digit into the span before it (leading ones into the
    first speakable span); all spans merge into one when none is speakable."""
    out: list[_Span] = []
    pending_start: int | None = None
    for start, end in spans:
        if has_speakable_text(text[start:end]):
            out.append((start if pending_start is None else pending_start, end))
            pending_start = None
        elif out:
            out[-1] = (out[-1][0], end)
        elif pending_start is None:
            pending_start = start
    if pending_start is not None:
        out.append((pending_start, spans[-1][1]))
    return out
