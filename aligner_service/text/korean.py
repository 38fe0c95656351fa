"""Korean words: soynlp's ``LTokenizer`` (soynlp 0.0.493), reproduced here, over the dictionary
the official aligner package ships (``assets/korean_dict_jieba.dict``, copied verbatim from
qwen-asr 0.0.6, Apache-2.0; every word scores 1.0, others 0.0).

soynlp itself is not a dependency: it pulls scipy and scikit-learn for a tokenizer of a dozen
lines. The rule, for each whitespace piece (``str.split()``): pieces of at most two characters stay
whole; longer ones split into L + R where L is the highest-scoring prefix of length >= 2, ties
going to the longest (so the longest dictionary prefix, or the whole piece when no prefix is in the
dictionary); an empty R is dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib import resources

from .pieces import Piece, whitespace_pieces

DICTIONARY = "korean_dict_jieba.dict"


@functools.cache
def dictionary_words() -> frozenset[str]:
    """The words of the shipped dictionary (each line's first field)."""
    text = resources.files(__package__).joinpath("assets", DICTIONARY).read_text(encoding="utf-8")
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def split_l_r(token: str, words: frozenset[str]) -> tuple[str, str]:
    """``LTokenizer``'s split of one whitespace piece into its L and R parts."""
    if len(token) <= 2:
        return token, ""
    for end in range(len(token), 1, -1):
        if token[:end] in words:
            return token[:end], token[end:]
    return token, ""


def korean_pieces(text: str) -> Iterator[Piece]:
    """The L and R parts of each whitespace piece of ``text`` (empty parts dropped)."""
    words = dictionary_words()
    for piece in whitespace_pieces(text):
        left, _ = split_l_r(piece.chars, words)
        yield Piece(left, piece.spans[: len(left)])
        if len(left) < len(piece.chars):
            yield Piece(piece.chars[len(left) :], piece.spans[len(left) :])


__all__ = ["DICTIONARY", "dictionary_words", "korean_pieces", "split_l_r"]
