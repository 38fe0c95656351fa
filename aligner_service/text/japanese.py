"""Japanese words: nagisa's segmentation (``nagisa.tagging(text).words``, a dependency: its words
come from a trained tagger, which cannot be reproduced by rules), mapped back to the original text.

nagisa reads a normalised copy of the text (right-stripped, NFKC, ``İ`` as ``I``, spaces as
ideographic spaces), so its words are substrings of that copy, not of the text. The copy is built
here the same way, in groups that normalise independently, remembering which span of the original
each group came from; a word's character then maps to its group's span.
"""

from __future__ import annotations

import functools
import threading
import unicodedata
from collections.abc import Iterator
from typing import Any

from tts_common.errors import FailedPreconditionError

from .pieces import Piece

_lock = threading.Lock()


@functools.cache
def _nagisa() -> Any:
    # Imported on first use: loading nagisa reads its model (~1 s) and prints DyNet's banner.
    try:
        import nagisa
    except ImportError as exc:
        raise FailedPreconditionError(
            f"Japanese word timings need nagisa, which is not installed ({exc})"
        ) from exc
    return nagisa


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _groups(text: str) -> list[tuple[int, int]]:
    """Cut ``text`` into spans that NFKC-normalise independently: each starter with the combining
    marks after it, merged with its neighbour where normalising the two apart differs from
    normalising them together (Hangul jamo, a few Indic vowel pairs)."""
    spans: list[tuple[int, int]] = []
    for pos, ch in enumerate(text):
        if spans and unicodedata.combining(ch):
            spans[-1] = (spans[-1][0], pos + 1)
            continue
        spans.append((pos, pos + 1))
    merged: list[tuple[int, int]] = []
    for span in spans:
        if merged:
            prev = merged[-1]
            a, b = text[prev[0] : prev[1]], text[span[0] : span[1]]
            if _nfkc(a + b) != _nfkc(a) + _nfkc(b):
                merged[-1] = (prev[0], span[1])
                continue
        merged.append(span)
    if "".join(_nfkc(text[s:e]) for s, e in merged) != _nfkc(text):
        return [(0, len(text))] if text else []
    return merged


def normalised_with_spans(text: str) -> tuple[str, list[tuple[int, int]]]:
    """The text nagisa reads and, per character of it, the span of ``text`` it came from."""
    text = text.rstrip()
    chars: list[str] = []
    spans: list[tuple[int, int]] = []
    for start, end in _groups(text):
        for ch in _nfkc(text[start:end]):
            chars.append(ch)
            spans.append((start, end))
    normalised = "".join(chars).replace("İ", "I").replace(" ", "\u3000")
    return normalised, spans


def japanese_pieces(text: str) -> Iterator[Piece]:
    """nagisa's words of ``text``, each with the original spans of its characters."""
    nagisa = _nagisa()
    with _lock:  # nagisa's tagger (DyNet) keeps state per call; one caller at a time
        words = nagisa.tagging(text).words
    normalised, spans = normalised_with_spans(text)
    pos = 0
    for word in words:
        found = normalised.find(word, pos)
        if found < 0:  # nagisa changed the text in a way not modelled above: span what is left
            yield Piece(word, [(spans[pos][0] if pos < len(spans) else len(text), len(text))] * len(word))
            continue
        yield Piece(word, spans[found : found + len(word)])
        pos = found + len(word)


__all__ = ["japanese_pieces", "normalised_with_spans"]
