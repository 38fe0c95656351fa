"""A segmenter's pieces of a text (:class:`Piece`) and the whitespace segmenter
(:func:`whitespace_pieces`), shared by :mod:`.units` and the language segmenters
(:mod:`.japanese`, :mod:`.korean`) that :mod:`.units` calls: kept apart so that neither imports
the other's caller."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """A segmenter's piece of a text: its characters (possibly normalised, as the segmenter read
    them) and, per character, the span ``[start, end)`` of the original text it stands for."""

    chars: str
    spans: Sequence[tuple[int, int]]


def whitespace_pieces(text: str) -> Iterator[Piece]:
    """``text.split()``'s pieces (same whitespace: ``str.isspace``), each with its own spans."""
    start = None
    for pos, ch in enumerate([*text, " "]):
        if ch.isspace():
            if start is not None:
                yield Piece(text[start:pos], [(k, k + 1) for k in range(start, pos)])
                start = None
        elif start is None:
            start = pos


__all__ = ["Piece", "whitespace_pieces"]
