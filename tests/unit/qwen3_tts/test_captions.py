"""Captions (qwen3_tts.captions): times formatted right (HH:MM:SS,mmm / HH:MM:SS.mmm, rounded to
the millisecond), cues monotonic and non-overlapping, every word in one cue in order, cue text
the request's own text, sentence ends and length limits respected; SRT and WebVTT files parse
back to the cues."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3_tts.captions import (
    MAX_CUE_CHARS,
    MAX_CUE_SECONDS,
    SENTENCE_END,
    TimedWord,
    caption_format,
    format_timestamp,
    group_cues,
    to_srt,
    to_webvtt,
    write_captions,
)

TIME = re.compile(r"(\d{2,}):([0-5]\d):([0-5]\d)[,.](\d{3})")


def parse_time(text: str) -> int:
    """Milliseconds of a formatted timestamp."""
    match = TIME.fullmatch(text)
    assert match, text
    h, m, s, ms = (int(g) for g in match.groups())
    return ((h * 60 + m) * 60 + s) * 1000 + ms


@given(st.floats(0, 10 * 86400, allow_nan=False))
def test_timestamps_round_to_the_millisecond(seconds: float) -> None:
    for decimal in (",", "."):
        text = format_timestamp(seconds, decimal)
        assert decimal in text and parse_time(text) == round(seconds * 1000)


WORD = st.text(st.characters(categories=["L", "Nd"]), min_size=1, max_size=12) | st.text(
    st.characters(categories=["L"]), min_size=30, max_size=90
)
SEPARATOR = st.sampled_from([" ", "  ", ", ", ". ", "! ", "? ", " - ", "\n", "。", " & <b> ", "; ", "、"])


@st.composite
def utterance(draw: st.DrawFn) -> tuple[str, list[TimedWord]]:
    """A text of words and separators, and timings: non-decreasing, touching or with gaps."""
    pieces = draw(st.lists(st.tuples(WORD, SEPARATOR), min_size=1, max_size=40))
    text = draw(st.sampled_from(["", '"', "  "]))
    words: list[TimedWord] = []
    now = draw(st.floats(0, 5000))
    for word, separator in pieces:
        start = now + draw(st.sampled_from([0.0, 0.0, 0.08, 0.4, 2.5]))
        end = start + draw(st.sampled_from([0.0, 0.08, 0.24, 1.1, 7.0]))
        words.append(TimedWord(word, start, end, len(text), len(text) + len(word)))
        text += word + separator
        now = end
    return text, words


@given(utterance())
def test_cues_hold_every_word_once_in_order_and_never_overlap(case: tuple[str, list[TimedWord]]) -> None:
    text, words = case
    cues = group_cues(words, text)
    assert [w for c in cues for w in c.words] == words
    previous_end = 0.0
    for cue in cues:
        assert previous_end <= cue.start <= cue.end
        assert cue.start >= cue.words[0].start and cue.end >= cue.words[-1].end
        previous_end = cue.end
    # The cues read as the text does: together, all of it, whitespace collapsed to single spaces.
    assert "".join("".join(c.text.split()) for c in cues) == "".join(text.split())
    assert all(c.text == " ".join(c.text.split()) for c in cues)
    for cue in cues:
        first, last = cue.words[0], cue.words[-1]
        spoken = " ".join(text[first.char_start : last.char_end].split())
        assert len(cue.words) == 1 or len(spoken) <= MAX_CUE_CHARS
        assert len(cue.words) == 1 or last.end - first.start <= MAX_CUE_SECONDS
        for a, b in zip(cue.words, cue.words[1:]):  # no sentence end inside a cue
            assert not SENTENCE_END.search(text[a.char_end : b.char_start])


def _blocks(document: str) -> list[list[str]]:
    return [b.split("\n") for b in document.strip("\n").split("\n\n")]


@given(utterance())
def test_srt_parses_back_to_the_cues(case: tuple[str, list[TimedWord]]) -> None:
    text, words = case
    cues = group_cues(words, text)
    blocks = _blocks(to_srt(cues))
    assert len(blocks) == len(cues)
    last = 0
    for n, (block, cue) in enumerate(zip(blocks, cues), 1):
        number, times, body = block
        assert number == str(n)
        start, end = (parse_time(t) for t in times.split(" --> "))
        assert (start, end) == (round(cue.start * 1000), round(cue.end * 1000))
        assert last <= start <= end
        last = end
        assert body == cue.text


@given(utterance())
def test_webvtt_parses_back_to_the_cues(case: tuple[str, list[TimedWord]]) -> None:
    text, words = case
    cues = group_cues(words, text)
    document = to_webvtt(cues)
    header, *blocks = _blocks(document)
    assert header == ["WEBVTT"]
    assert len(blocks) == len(cues)
    last = 0
    for block, cue in zip(blocks, cues):
        times, body = block
        start, end = (parse_time(t) for t in times.split(" --> "))
        assert (start, end) == (round(cue.start * 1000), round(cue.end * 1000))
        assert last <= start <= end
        last = end
        assert "<" not in body and "-->" not in body and html.unescape(body) == cue.text


def test_caption_format_and_file(tmp_path: Path) -> None:
    assert caption_format("a.SRT") == "srt" and caption_format(Path("x/b.vtt")) == "vtt"
    with pytest.raises(ValueError, match=r"\.srt or \.vtt"):
        caption_format("out.txt")
    text = "Hello world. How are you?"
    words = [
        TimedWord("Hello", 0.1, 0.4, 0, 5),
        TimedWord("world", 0.4, 0.9, 6, 11),
        TimedWord("How", 1.2, 1.3, 13, 16),
        TimedWord("are", 1.3, 1.5, 17, 20),
        TimedWord("you", 1.5, 1.8, 21, 24),
    ]
    cues = write_captions(tmp_path / "out.srt", words, text)
    assert [c.text for c in cues] == ["Hello world.", "How are you?"]
    assert (tmp_path / "out.srt").read_text().startswith("1\n00:00:00,100 --> 00:00:00,900\nHello world.\n")
    write_captions(tmp_path / "out.vtt", words, text)
    assert "00:00:01.200 --> 00:00:01.800\nHow are you?" in (tmp_path / "out.vtt").read_text()
    assert group_cues([], "") == []


def test_a_long_sentence_breaks_at_its_last_clause_mark() -> None:
    text = "The quiet harbour woke slowly, and the fishing boats drifted out past the old stone pier."
    words = [
        TimedWord(m.group(), 0.3 * k, 0.3 * k + 0.2, m.start(), m.end())
        for k, m in enumerate(re.finditer(r"\w+", text))
    ]
    assert [c.text for c in group_cues(words, text)] == [
        "The quiet harbour woke slowly,",
        "and the fishing boats drifted out past the old stone pier.",
    ]
