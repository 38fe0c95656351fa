"""Where NFC normalisation of a growing text can no longer change: the character properties the
incremental tokenizer (:mod:`.streaming_text`) needs, derived from :mod:`unicodedata`.

NFC decomposes, reorders runs of combining marks by combining class, then composes each mark (or
a composing starter such as a Hangul vowel jamo) with the last starter before it. Appending text
can therefore change the normalised form back to the last character that text after it may
interact with. Two properties bound that reach:

* :func:`boundary_before` (``c``): nothing before ``c`` ever interacts with ``c`` or anything after
  it -- ``c`` decomposes to a starter (combining class 0, so no reordering crosses it) that is not
  the second half of any canonical composition. Then ``NFC(a + c + b) == NFC(a) + NFC(c + b)``
  for all ``a``, ``b``.
* :func:`boundary_after` (``c``): nothing after ``c`` ever interacts with ``c`` or anything before
  it -- ``c`` decomposes to a sequence ending with a starter that is neither half of any
  canonical composition. Then ``NFC(a + c + b) == NFC(a + c) + NFC(b)``. Not a second half
  either, since compositions chain: a vowel jamo composes with the consonant before it into an
  LV syllable, which composes with a trailing consonant after it (ᄀ + ᅡ + ᆨ is 각), and Kannada's
  U+0CC2 likewise (U+0CC6 U+0CC2 is U+0CCA, which composes with U+0CD5).

The composition pairs are read from this Python's Unicode database (a one-time scan of all code
points, ~0.5 s: :func:`warm` runs it at model load, off the engine thread). A tokenizer library
built on a newer Unicode version may know characters this database does not: unassigned code
points (category Cn) have neither property, so a character new to us is never treated as a
boundary. Normalisation stability guarantees that characters assigned in both versions gain no
new compositions.
"""

from __future__ import annotations

import functools
import unicodedata

_HANGUL_L = range(0x1100, 0x1113)
"""Leading consonant jamo: compose with a following vowel jamo."""
_HANGUL_V = range(0x1161, 0x1176)
"""Vowel jamo: compose with a preceding leading consonant."""
_HANGUL_T = range(0x11A8, 0x11C3)
"""Trailing consonant jamo: compose with a preceding LV syllable."""
_HANGUL_SYLLABLES = range(0xAC00, 0xD7A4)
_HANGUL_T_COUNT = 28

# Characters the Qwen2 split regex's \s may match besides those str.isspace() knows: code points
# that were White_Space in some Unicode version (treated as spaces: the rules using
# is_split_space only get more cautious).
_EXTRA_SPACES = frozenset("\u180e\u200b\u2060\ufeff")


@functools.cache
def _composition_halves() -> tuple[frozenset[str], frozenset[str]]:
    """(first halves, second halves) of every canonical composition NFC performs."""
    first: set[str] = {chr(cp) for cp in _HANGUL_L}
    second: set[str] = {chr(cp) for cp in (*_HANGUL_V, *_HANGUL_T)}
    first.update(chr(cp) for cp in _HANGUL_SYLLABLES if (cp - 0xAC00) % _HANGUL_T_COUNT == 0)  # LV
    for cp in range(0x110000):
        ch = chr(cp)
        decomposition = unicodedata.decomposition(ch)
        if not decomposition or decomposition.startswith("<"):  # none, or a compatibility one
            continue
        parts = decomposition.split()
        if len(parts) != 2:
            continue
        a, b = chr(int(parts[0], 16)), chr(int(parts[1], 16))
        if unicodedata.normalize("NFC", a + b) == ch:  # not a composition exclusion
            first.add(a)
            second.add(b)
    return frozenset(first), frozenset(second)


def warm() -> None:
    """Build the composition tables now (they are built on first use otherwise)."""
    _composition_halves()


def _assigned(ch: str) -> bool:
    return unicodedata.category(ch) != "Cn"


@functools.lru_cache(maxsize=65536)
def boundary_before(ch: str) -> bool:
    """NFC never joins ``ch`` (or what follows it) with what precedes it (module docstring)."""
    if ch.isascii():
        return True  # ASCII characters are starters and no composition ends with one
    if not _assigned(ch):
        return False
    head = unicodedata.normalize("NFD", ch)[0]
    _, second = _composition_halves()
    return unicodedata.combining(head) == 0 and head not in second and ch not in second


@functools.lru_cache(maxsize=65536)
def boundary_after(ch: str) -> bool:
    """NFC never joins ``ch`` (or what precedes it) with what follows it (module docstring)."""
    if not _assigned(ch):
        return False
    tail = unicodedata.normalize("NFD", ch)[-1]
    first, second = _composition_halves()
    composed = unicodedata.normalize("NFC", ch)
    return unicodedata.combining(tail) == 0 and not ({tail, ch, composed[-1]} & (first | second))


def is_split_space(ch: str) -> bool:
    """A superset of the characters the Qwen2 split regex's ``\\s`` matches."""
    return ch.isspace() or unicodedata.category(ch)[0] == "Z" or ch in _EXTRA_SPACES or not _assigned(ch)


__all__ = ["boundary_after", "boundary_before", "is_split_space", "warm"]
