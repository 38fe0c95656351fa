"""A tokenizer-free, deliberately high estimate of a text's Qwen text-token count.

For callers without the checkpoint's tokenizer. Qwen's byte-level BPE (151k vocabulary, split
regex with one digit per piece) gives about one token per common CJK character or fewer (frequent
words merge), one per digit, one per punctuation mark or fewer, and about one per common Latin
word (3-6 letters a token), more for other alphabets (2-4 letters a token). The estimate rounds
every one of those up:

- each Han, kana or Hangul character: 1
- each digit: 1
- each run of other letters: one per 4 UTF-8 bytes, rounded up (ASCII words: one per 4 letters;
  Cyrillic, Greek: one per 2 letters; accented Latin letters count as 2 bytes)
- each other non-space character (punctuation, symbols, emoji): 1
- each run of line breaks: 1; other whitespace: 0 (BPE merges a space into the next word)

It overestimates typical text (English by roughly 1.5x), so segments packed with it stay under
the same limit measured with the real tokenizer, except for rare CJK characters (which byte-level
BPE may spend 2-3 tokens on) and unusual strings of letters. Pass the real tokenizer's counter to
``segment_text`` whenever it is at hand.
"""

from __future__ import annotations

import re

from tts_common.text.chars import LINE_BREAKS, WIDE_CHARS

_BYTES_PER_TOKEN = 4
_BREAKS = re.escape("".join(sorted(LINE_BREAKS)))

# Runs of letters other than Han/kana/Hangul; every other non-space character counts 1.
_LETTERS = re.compile(rf"[^\W\d_{WIDE_CHARS}]+")
_SPACE = re.compile(r"\s")
_BREAK_RUNS = re.compile(f"[{_BREAKS}]+")


def estimate_tokens(text: str) -> int:
    """A conservative (high) estimate of the Qwen text-token count of ``text`` (rules above)."""
    words = _LETTERS.findall(text)
    single = len(text) - len(_SPACE.findall(text)) - sum(map(len, words))
    by_bytes = sum(-(-len(w.encode("utf-8")) // _BYTES_PER_TOKEN) for w in words)
    return by_bytes + single + len(_BREAK_RUNS.findall(text))
