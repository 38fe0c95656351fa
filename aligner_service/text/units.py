"""Timing units of a text and their code-point spans.

WORD mode follows the official aligner's word split (``Qwen3ForceAlignProcessor.encode_timestamp``
of qwen-asr 0.0.6):

* Japanese: nagisa's words (:mod:`.japanese`); Korean: soynlp's ``LTokenizer`` over the dictionary
  the official package ships (:mod:`.korean`); every other language, Chinese included: the
  whitespace split (``str.split()``);
* each piece then keeps only Unicode letters (L*), digits (N*) and ``'`` (so ``3.5-hour`` is one
  unit, ``35hour``), and a piece left empty is dropped;
* on the whitespace path only, each CJK ideograph of a cleaned piece is its own unit (the Latin
  runs between them stay whole).

CHARACTER mode makes every letter or digit its own unit.

Each unit also carries the span of the ORIGINAL text it was read from, in code points, from its
first to its last kept character (so punctuation between or around units belongs to none).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from .japanese import japanese_pieces
from .korean import korean_pieces
from .pieces import Piece, whitespace_pieces

UnitMode = Literal["word", "character"]
"""How a text is cut into timing units."""


@dataclass(frozen=True)
class Unit:
    """One timing unit: what the aligner reads and where it came from."""

    text: str
    """The unit as the aligner reads it (letters, digits and ``'`` only; never empty)."""
    char_start: int
    """First code point of the unit's span of the original text."""
    char_end: int
    """One past its last code point: the span is ``text[char_start:char_end]`` of the original."""


def is_kept_char(ch: str) -> bool:
    """Whether the aligner keeps ``ch`` in a word: a letter, a digit or ``'``."""
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


# Ranges the official processor treats as CJK ideographs (split one per unit on the whitespace
# path): the Unified block, Extensions A to E and the Compatibility block.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
)


def is_cjk_ideograph(ch: str) -> bool:
    """Whether ``ch`` is a CJK ideograph by the official processor's ranges."""
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _CJK_RANGES)


def _unit(piece: Piece, indices: Sequence[int]) -> Unit:
    return Unit(
        text="".join(piece.chars[k] for k in indices),
        char_start=piece.spans[indices[0]][0],
        char_end=piece.spans[indices[-1]][1],
    )


def _clean(piece: Piece, *, split_cjk: bool) -> Iterator[Unit]:
    """The units of one piece: its kept characters, ideographs split off when ``split_cjk``."""
    run: list[int] = []
    for k, ch in enumerate(piece.chars):
        if not is_kept_char(ch):
            continue
        if split_cjk and is_cjk_ideograph(ch):
            if run:
                yield _unit(piece, run)
                run = []
            yield _unit(piece, [k])
        else:
            run.append(k)
    if run:
        yield _unit(piece, run)


def word_units(text: str, language: str = "") -> list[Unit]:
    """The official word split of ``text`` for ``language`` (case and surrounding spaces ignored;
    ``"japanese"`` and ``"korean"`` have their own segmenters, anything else, ``""`` and
    ``"auto"`` included, is split on whitespace). The one place a language name becomes a word
    split: callers (the gateway, the offline CLI) pass a request's language as it is."""
    lang = language.strip().lower()
    if lang == "japanese":
        return [u for piece in japanese_pieces(text) for u in _clean(piece, split_cjk=False)]
    if lang == "korean":
        return [u for piece in korean_pieces(text) for u in _clean(piece, split_cjk=False)]
    return [u for piece in whitespace_pieces(text) for u in _clean(piece, split_cjk=True)]


def character_units(text: str) -> list[Unit]:
    """Every letter or digit of ``text`` as its own unit (``'`` and everything else dropped)."""
    return [Unit(ch, pos, pos + 1) for pos, ch in enumerate(text) if unicodedata.category(ch)[0] in "LN"]


def split_units(text: str, language: str = "", mode: UnitMode = "word") -> list[Unit]:
    """The timing units of ``text`` (empty when it has no letter or digit)."""
    if mode == "character":
        return character_units(text)
    if mode == "word":
        return word_units(text, language)
    raise ValueError(f"unknown unit mode {mode!r} (word or character)")


__all__ = [
    "Unit",
    "UnitMode",
    "character_units",
    "is_cjk_ideograph",
    "is_kept_char",
    "split_units",
    "word_units",
]
