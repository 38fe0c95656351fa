"""Character classes the segmentation rules are written in (the rules: ``tts_common.text``)."""

from __future__ import annotations

import re
import unicodedata

# What str.splitlines() breaks on; the scanner counts "\r\n" as one line break.
LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")

# Sentence-end marks of the Latin/Cyrillic languages: they end a sentence only when the context
# says so (whitespace and a non-lowercase word after, no abbreviation before, ...).
WESTERN_TERMINATORS = frozenset(".!?…‼⁇⁈⁉")
# Ideographic marks: they end a sentence wherever they stand (no spaces in CJK text). The
# full-width full stop also appears in full-width decimals (３．１４), handled by the scanner.
CJK_TERMINATORS = frozenset("。！？；．｡")
TERMINATORS = WESTERN_TERMINATORS | CJK_TERMINATORS

# Closing quotes and brackets that belong to the sentence whose end mark they follow. “ ‘ « ‹
# close quotations in German („…“, »…«) but open them in Chinese after 。, so they are absorbed
# only after a Western mark (OPENING_AFTER_CJK).
CLOSERS = frozenset("\"')]}»«›‹”“’‘」』）］｝】》〉〕〗〙〛")
OPENING_AFTER_CJK = frozenset("“‘«‹")
# French sets guillemets and ! ? : ; off with (narrow) no-break spaces: « Non ! »
NO_BREAK_SPACES = frozenset("\u00a0\u202f\u2007")

# Clause marks, where a sentence too long for one segment is cut. CJK ones and dashes cut
# wherever they stand; Western ones only before whitespace (or a CJK character) so that 1,000
# and 12:30 and URLs stay whole. A lone "." never cuts a clause (Dr. Smith, 3.14); two or more
# (an ellipsis) do, like "…".
CJK_CLAUSE_MARKS = frozenset("，、；：､")
DASHES = frozenset("—―")
WESTERN_CLAUSE_MARKS = frozenset(",;:!?…‼⁇⁈⁉")
SPACED_DASHES = frozenset("-–")  # a clause mark only with whitespace on both sides

_HAN_KANA = (
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # 々 〇 and the Hangzhou numerals / iteration marks
    "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # hiragana, katakana (+ phonetic ext., half-width)
    "\u3100-\u312f\u31a0-\u31bf"  # bopomofo
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"  # Han
)
_HANGUL = "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
# The scripts without Latin-style capitals after a full stop: Han and kana (written without
# spaces between words) and Hangul. Used in regex character classes.
WIDE_CHARS = _HAN_KANA + _HANGUL
_WIDE = re.compile(f"[{WIDE_CHARS}]")
_HAN_KANA_RE = re.compile(f"[{_HAN_KANA}]")

# Japanese line-breaking rules (kinsoku): these never start a piece when text without spaces is
# cut between characters (small kana, the long-vowel mark, iteration marks).
_NO_BREAK_BEFORE = frozenset(
    "ぁぃぅぇぉっゃゅょゎゕゖァィゥェォッャュョヮヵヶㇰㇱㇲㇳㇴㇵㇶㇷㇸㇹㇺㇻㇼㇽㇾㇿーゝゞヽヾ々〻ｧｨｩｪｫｬｭｮｯｰ"
)


def is_wide(ch: str) -> bool:
    """A Han, kana or Hangul character."""
    return _WIDE.match(ch) is not None


def is_speakable(ch: str) -> bool:
    """A letter or a digit of any script: something the talker can say."""
    return unicodedata.category(ch)[0] in "LN"


def can_break_between(left: str, right: str) -> bool:
    """Whether a run without spaces may be cut between the adjacent characters ``left`` and
    ``right``: only next to a Han/kana character (a Latin word inside Chinese text stays whole),
    never before punctuation other than an opening one or before a small kana, and never after an
    opening bracket or quote."""
    if _HAN_KANA_RE.match(left) is None and _HAN_KANA_RE.match(right) is None:
        return False
    right_cat = unicodedata.category(right)
    if right in _NO_BREAK_BEFORE or (right_cat[0] == "P" and right_cat not in ("Ps", "Pi")):
        return False
    return unicodedata.category(left) not in ("Ps", "Pi")
