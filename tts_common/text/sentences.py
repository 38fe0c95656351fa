"""Sentence boundaries, one-shot (``split_sentences``) and incremental
(``IncrementalSentenceSplitter``), from one scanner. The rules are described in ``tts_common.text``.

Every decision is local: it reads the current sentence back to its first character and the text
forward at most to the first non-space character after an end mark (or to the end of a
whitespace run). When that look-ahead runs past what has arrived so far the scanner stops and
waits for more text, so a decision, once taken, is the one the whole text would give; this is
what makes the incremental splitter equal to the one-shot one for any split into deltas.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from tts_common.text.chars import (
    CJK_TERMINATORS,
    CLOSERS,
    LINE_BREAKS,
    NO_BREAK_SPACES,
    OPENING_AFTER_CJK,
    TERMINATORS,
    is_wide,
)


@dataclass(frozen=True)
class Segment:
    """A piece of a text: ``text == original[start:end]``, with no leading or trailing whitespace.

    ``start`` and ``end`` are character offsets into the original text (for the incremental
    splitter: into the concatenation of every delta pushed so far).
    """

    start: int
    end: int
    text: str

    def shifted(self, offset: int) -> Segment:
        """The same piece with its offsets moved by ``offset`` (e.g. from a sentence's own text
        into the text the sentence came from)."""
        return Segment(self.start + offset, self.end + offset, self.text)


def _with_capitalized(words: set[str]) -> frozenset[str]:
    # A sentence can start with one of these ("E.g. ...", "Vs. ...").
    return frozenset(words | {w[0].upper() + w[1:] for w in words})


# Abbreviations that (practically) never end a sentence, matched case-sensitively against the
# letters-and-dots word before a ".": titles and "for example"-like ones of the served languages.
# Abbreviations that often do end one (etc., usw., ecc., Inc., U.S.) are left to the general rule
# (an end unless a lowercase word follows).
NEVER_SENTENCE_END = _with_capitalized(
    {
        # English
        "Mr", "Mrs", "Ms", "Mx", "Dr", "Prof", "Rev", "Hon", "Gen", "Col", "Capt", "Lt", "Sgt",
        "Gov", "Sen", "Rep", "Pres", "St", "Mt", "Ft", "Sr", "Jr", "vs", "e.g", "i.e", "cf", "viz",
        "approx", "Fig", "Figs", "Eq", "Sec", "Ch", "Vol", "Ed", "Eds",
        # German
        "Hr", "Hrn", "Fr", "Frl", "z.B", "z", "d.h", "u.a", "bzw", "ggf", "vgl", "Dipl", "Ing", "Str",
        # French
        "MM", "Mme", "Mmes", "Mlle", "Mlles", "Me", "Pr", "Ste", "av", "bd", "p.ex", "env",
        # Spanish / Portuguese
        "Sra", "Srta", "Sres", "Dra", "Ud", "Uds", "Vd", "Vds", "Dña", "Exmo", "Exma", "p.ej", "aprox",
        # Italian
        "Sig", "Sigg", "Sig.ra", "Sig.na", "Dott", "Dott.ssa", "Prof.ssa", "Avv", "Geom", "p.es",
        # Russian
        "т.е", "т.к", "т.н", "ул", "пр", "им", "св", "проф", "акад", "доц", "напр", "рис", "стр",
    }
)  # fmt: skip
# Abbreviations that do not end a sentence when a number follows ("No. 5", "p. 12", "Nr. 3").
NOT_END_BEFORE_NUMBER = _with_capitalized(
    {"no", "nos", "nr", "nº", "n", "p", "pp", "art", "abs", "bd", "vol", "ch", "fig", "s", "núm", "pág", "№"}
)

_BANGS = frozenset("!?‼⁇⁈⁉")
_NEED_MORE = None  # a decision needs text that has not arrived yet
_NOT_SPACE = re.compile(r"\S")
# Characters at which the scanner has something to decide; everything else is skipped at once.
_EVENT = re.compile("[\\s" + re.escape("".join(sorted(TERMINATORS))) + "]")


class _Scanner:
    """The sentence scanner over a growing buffer (trimmed to the current sentence)."""

    def __init__(self, single_newline_is_boundary: bool) -> None:
        self._hard_breaks = 1 if single_newline_is_boundary else 2
        self._buf = ""
        self._base = 0  # offset of _buf[0] in the whole text
        self._start: int | None = None  # _buf index of the current sentence's first character
        self._pos = 0  # next _buf index to examine
        self._finished = False

    def push(self, delta: str) -> list[Segment]:
        if self._finished:
            raise RuntimeError("text pushed after finish()")
        self._buf += delta
        return self._scan(final=False)

    def finish(self) -> list[Segment]:
        if self._finished:
            return []
        out = self._scan(final=True)
        if self._start is not None:
            end = len(self._buf.rstrip())
            out.append(self._segment(self._start, end))
            self._start = None
        self._finished = True
        self._trim()
        return out

    def _segment(self, start: int, end: int) -> Segment:
        return Segment(self._base + start, self._base + end, self._buf[start:end])

    def _trim(self) -> None:
        cut = self._pos if self._start is None else self._start
        self._buf = self._buf[cut:]
        self._base += cut
        self._pos -= cut
        if self._start is not None:
            self._start -= cut

    def _scan(self, final: bool) -> list[Segment]:
        out: list[Segment] = []
        buf, n, pos = self._buf, len(self._buf), self._pos
        while pos < n:
            if self._start is None:
                m = _NOT_SPACE.search(buf, pos)
                if m is None:
                    pos = n
                    break
                self._start = pos = m.start()
            ch = buf[pos]
            if ch.isspace():
                run = self._whitespace_run(pos, final)
                if run is _NEED_MORE:
                    break
                hard, after = run
                if hard:
                    # Runs are entered at their first character: pos ends the sentence's text.
                    out.append(self._segment(self._start, pos))
                    self._start = None
                pos = after
                continue
            if ch in TERMINATORS:
                decision = self._after_end_mark(pos, final)
                if decision is _NEED_MORE:
                    break
                ends, pos = decision
                if ends:
                    out.append(self._segment(self._start, pos))
                    self._start = None
                continue
            m = _EVENT.search(buf, pos)
            pos = n if m is None else m.start()
        self._pos = pos
        self._trim()
        return out

    def _sentence_start(self) -> int:
        assert self._start is not None  # only called inside a sentence
        return self._start

    def _whitespace_run(self, pos: int, final: bool) -> tuple[bool, int] | None:
        """Scan the whitespace run at ``pos``: (True, index past the line break that makes it a
        boundary) or (False, index of the non-space character after it, or the buffer end when
        ``final``); _NEED_MORE when the run reaches the buffer end and more text may follow."""
        buf, n = self._buf, len(self._buf)
        breaks, i = 0, pos
        while i < n and buf[i].isspace():
            ch = buf[i]
            if ch in LINE_BREAKS and not (ch == "\n" and i > pos and buf[i - 1] == "\r"):
                breaks += 1
                if breaks >= self._hard_breaks:
                    return True, i + 1
            i += 1
        if i == n and not final:
            return _NEED_MORE
        return False, i

    def _after_end_mark(self, pos: int, final: bool) -> tuple[bool, int] | None:
        """Decide the run of end marks (and closing quotes/brackets) starting at ``pos``:
        (True, end of the sentence) or (False, index to go on scanning from); _NEED_MORE when the
        decision depends on text that has not arrived."""
        buf, n = self._buf, len(self._buf)
        marks: list[str] = []
        cjk = closed = False
        k = pos
        while True:
            if k == n:
                return _NEED_MORE if not final else (True, k)
            ch = buf[k]
            if ch in TERMINATORS:
                marks.append(ch)
                cjk = cjk or ch in CJK_TERMINATORS
            elif ch in CLOSERS and not (cjk and ch in OPENING_AFTER_CJK):
                closed = True
            elif ch in NO_BREAK_SPACES:
                # French « Non ! »: a closer after no-break spaces still belongs to the sentence.
                j = k
                while j < n and buf[j] in NO_BREAK_SPACES:
                    j += 1
                if j == n and not final:
                    return _NEED_MORE
                if j == n or buf[j] not in CLOSERS or (cjk and buf[j] in OPENING_AFTER_CJK):
                    break
                closed, k = True, j
            else:
                break
            k += 1
        nxt = buf[k]
        run = "".join(marks)
        if cjk:
            # Full-width decimals and versions (３．１４, ｖ２．０) keep their full stop.
            return not (run == "．" and not closed and nxt.isalnum() and not is_wide(nxt)), k
        if not nxt.isspace():
            # "3.14", "e.g.", "www.x.com", "a?b=1": no space, no end. But CJK text has no spaces
            # after the Western marks it uses either: "好.中文", "真的?Yes".
            after_cjk = pos > self._sentence_start() and is_wide(buf[pos - 1]) and set(run) <= _BANGS
            return is_wide(nxt) or after_cjk, k
        ws = self._whitespace_run(k, final)
        if ws is _NEED_MORE:
            return _NEED_MORE
        hard, m = ws
        if hard or m == n:
            return True, k
        nxt = buf[m]
        if run == "." and not closed:
            return self._period_ends(pos, nxt), k
        # "Wait... what?", "“Go!” he said": a lowercase word continues the sentence.
        return not nxt.islower(), k

    def _period_ends(self, pos: int, nxt: str) -> bool:
        """Whether the single "." at ``pos``, followed by whitespace and ``nxt``, ends the
        sentence, judged by the letters-and-dots word before it (within the sentence)."""
        buf, start = self._buf, self._sentence_start()
        i = pos
        while i > start and (buf[i - 1].isalnum() or buf[i - 1] == "."):
            i -= 1
        word = buf[i:pos]
        if word in NEVER_SENTENCE_END:
            return False
        if nxt.isdigit() and word in NOT_END_BEFORE_NUMBER:
            return False
        # Initials and ordinals are words of their own ("x=1. Then", "Plan-B. Then" end).
        if i == start or buf[i - 1].isspace() or unicodedata.category(buf[i - 1]) in ("Ps", "Pi"):
            if len(word) == 1 and word.isupper():
                return False  # an initial: "J. R. R. Tolkien", "А. С. Пушкин"
            if word.isdigit() and len(word) <= 2:
                return False  # an ordinal: "am 3. Oktober", "der 19. Jahrhundert"
        return not nxt.islower()


def split_sentences(text: str, *, single_newline_is_boundary: bool = True) -> list[Segment]:
    """The sentences of ``text``, in order (rules: ``tts_common.text``). Whitespace-only text
    gives no sentence; a sentence may have nothing speakable (``"…"``, ``"* * *"``)."""
    scanner = _Scanner(single_newline_is_boundary)
    return scanner.push(text) + scanner.finish()


class IncrementalSentenceSplitter:
    """Sentence boundaries over text that arrives in pieces (e.g. an LLM's output deltas).

    ``push`` returns the sentences that are complete: no later text can move their end. A
    sentence is held back while its end depends on what comes next ("Dr." or "3." before the
    next character, "." before a possible digit, an end mark before possible closing quotes).
    ``finish`` returns the rest. For any text and any split of it into deltas, the sentences
    returned (offsets into the concatenated deltas) equal ``split_sentences`` of the whole text.
    """

    def __init__(self, *, single_newline_is_boundary: bool = True) -> None:
        self._scanner = _Scanner(single_newline_is_boundary)

    def push(self, delta: str) -> list[Segment]:
        """Add ``delta`` (any length, cut anywhere, even inside a word); return the sentences it
        completed. Raises RuntimeError after ``finish``."""
        return self._scanner.push(delta)

    def finish(self) -> list[Segment]:
        """The text has ended: return the remaining sentence (if any). Further calls return []."""
        return self._scanner.finish()
