"""Captions from word timings: SRT and WebVTT files (``qwen3-tts say --captions out.srt|out.vtt``).

Words are grouped into cues the way subtitle guidelines do: a cue ends at a sentence end, or
before it would grow past :data:`MAX_CUE_CHARS` characters or :data:`MAX_CUE_SECONDS` seconds
(then after its last clause mark where that keeps a third of it, so no word is left alone).
A cue's text is the request's own text from its first word to the next cue's first word
(punctuation and case kept, whitespace collapsed to single spaces), so the cues read as the text
does. Times are rounded to the millisecond; cues never overlap and never go back in time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_CUE_CHARS = 84
"""Two lines of 42 characters, the common broadcast limit."""

MAX_CUE_SECONDS = 6.0
"""Longer cues are hard to follow."""

SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f\u2026]")
"""Punctuation after a word that ends its sentence (Latin and CJK full stops, !, ?, ellipsis)."""

CLAUSE_END = re.compile(r"[,;:\u2014\u3001\uff0c\uff1b\uff1a]")
"""Punctuation after a word that ends a clause: a long sentence's cues break there if they can."""

FORMATS = {".srt": "srt", ".vtt": "vtt"}
"""Caption file extension -> format."""


@dataclass(frozen=True)
class TimedWord:
    """One word (or character) and when it is heard."""

    text: str
    start: float
    """Seconds from the start of the audio."""
    end: float
    char_start: int
    """Its span of the request's text, in code points: ``[char_start, char_end)``."""
    char_end: int


@dataclass(frozen=True)
class Cue:
    """One caption: shown from ``start`` to ``end`` (seconds)."""

    start: float
    end: float
    text: str
    words: tuple[TimedWord, ...]


def caption_format(path: str | Path) -> str:
    """``"srt"`` or ``"vtt"`` from a caption file's extension; ValueError for another one."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"captions file {path}: the extension must be .srt or .vtt")
    return FORMATS[suffix]


def _collapse(text: str) -> str:
    return " ".join(text.split())


def group_cues(
    words: Sequence[TimedWord],
    text: str,
    max_chars: int = MAX_CUE_CHARS,
    max_seconds: float = MAX_CUE_SECONDS,
) -> list[Cue]:
    """The cues of ``words`` (in the order of ``text``, times non-decreasing) over ``text``."""
    groups: list[list[TimedWord]] = []
    for word in words:
        current = groups[-1] if groups else None
        if current is None or SENTENCE_END.search(text[current[-1].char_end : word.char_start]):
            groups.append([word])
        elif (
            len(_collapse(text[current[0].char_start : word.char_end])) > max_chars
            or word.end - current[0].start > max_seconds
        ):
            # too long: break after the cue's last clause mark if that keeps a third of it, else here
            cut = _clause_cut(current, text, max_chars // 3)
            moved = [*current[cut:], word]
            if len(_collapse(text[moved[0].char_start : word.char_end])) > max_chars or (
                word.end - moved[0].start > max_seconds
            ):
                cut, moved = len(current), [word]
            groups[-1:] = [current[:cut], moved]
        else:
            current.append(word)
    cues: list[Cue] = []
    for i, group in enumerate(groups):
        begin = 0 if i == 0 else group[0].char_start
        finish = len(text) if i == len(groups) - 1 else groups[i + 1][0].char_start
        start = max(group[0].start, cues[-1].end if cues else 0.0)
        end = max(group[-1].end, start)
        cues.append(Cue(start, end, _collapse(text[begin:finish]), tuple(group)))
    return cues


def _clause_cut(group: list[TimedWord], text: str, min_chars: int) -> int:
    """Where to break ``group``: after its last word followed by a clause mark that leaves at
    least ``min_chars`` before the break; else after its last word."""
    for k in range(len(group) - 1, 0, -1):
        if CLAUSE_END.search(text[group[k - 1].char_end : group[k].char_start]):
            if len(_collapse(text[group[0].char_start : group[k - 1].char_end])) >= min_chars:
                return k
            break
    return len(group)


def format_timestamp(seconds: float, decimal: str) -> str:
    """``HH:MM:SS<decimal>mmm`` (hours at least two digits), rounded to the millisecond."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def to_srt(cues: Sequence[Cue]) -> str:
    """SubRip: numbered blocks, ``00:00:01,250 --> 00:00:02,000``, separated by blank lines."""
    blocks = [
        f"{n}\n{format_timestamp(c.start, ',')} --> {format_timestamp(c.end, ',')}\n{c.text}\n"
        for n, c in enumerate(cues, 1)
    ]
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    # WebVTT cue text is markup: & and < start entities and tags; > is escaped so that "-->"
    # cannot appear.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_webvtt(cues: Sequence[Cue]) -> str:
    """WebVTT: the ``WEBVTT`` header, then ``00:00:01.250 --> 00:00:02.000`` cues."""
    blocks = [
        f"{format_timestamp(c.start, '.')} --> {format_timestamp(c.end, '.')}\n{_vtt_escape(c.text)}\n"
        for c in cues
    ]
    return "\n".join(["WEBVTT\n", *blocks])


def write_captions(path: str | Path, words: Sequence[TimedWord], text: str) -> list[Cue]:
    """Write ``words`` over ``text`` as captions to ``path`` (format from its extension); the
    cues written."""
    kind = caption_format(path)
    cues = group_cues(words, text)
    Path(path).write_text(to_srt(cues) if kind == "srt" else to_webvtt(cues), encoding="utf-8")
    return cues


__all__ = [
    "Cue",
    "TimedWord",
    "caption_format",
    "format_timestamp",
    "group_cues",
    "to_srt",
    "to_webvtt",
    "write_captions",
]
