"""Offline timestamps (qwen3_tts.offline_timestamps): each segment aligned alone, its units moved
to the request's text and the joined audio; the JSON in the HTTP API's shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from qwen3_tts.offline import OfflineResult, OfflineSegment
from qwen3_tts.offline_timestamps import (
    align_result,
    timestamps_document,
    write_timestamps,
)

RATE = 24000


class EvenAligner:
    """Each whitespace word of the text, evenly over the audio and 80 ms past its end (as the
    aligner's last class can be); records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, str]] = []

    def align(self, audio, sample_rate, text, language, unit):
        assert sample_rate == RATE and audio.dtype == np.float32
        self.calls.append((audio.size, text, language))
        words = list(re.finditer(r"\S+", text))
        step = 1000 * audio.size / sample_rate / max(len(words), 1)
        return [(m.group(), m.start(), m.end(), k * step, (k + 1) * step + 80) for k, m in enumerate(words)]


@st.composite
def synthesized(draw: st.DrawFn) -> tuple[str, OfflineResult]:
    """A text cut into segments (with whitespace between), each with some audio."""
    pieces = draw(
        st.lists(
            st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), min_size=1, max_size=6),
            min_size=1,
            max_size=5,
        )
    )
    text, segments, wavs = "", [], []
    for k, words in enumerate(pieces):
        text += " " if k else ""
        start = len(text)
        text += " ".join(words)
        samples = draw(st.integers(0, 3)) * 1920
        wavs.append(np.full(samples, k, np.float32))
        segments.append(OfflineSegment(start, len(text), k, samples // 1920, "EOS", samples))
    result = OfflineResult(np.zeros((0, 16), np.int64), np.concatenate(wavs), segments)
    return text, result


@given(synthesized())
def test_units_move_to_the_request_s_text_and_audio(case: tuple[str, OfflineResult]) -> None:
    text, result = case
    aligner = EvenAligner()
    spans = align_result(aligner, result, text, RATE, "English")
    with_audio = [s for s in result.segments if s.num_samples]
    # each segment with audio aligned alone, on its own audio and text
    # the request's language as is: the aligner's word split reads it (case, "auto")
    assert aligner.calls == [(s.num_samples, text[s.start : s.end], "English") for s in with_audio]
    offsets = np.cumsum([0] + [s.num_samples for s in result.segments])
    expected_words = [w for s in with_audio for w in text[s.start : s.end].split()]
    assert [text[s.char_start : s.char_end] for s in spans] == [s.text for s in spans] == expected_words
    for span in spans:
        (k,) = [k for k, s in enumerate(result.segments) if s.start <= span.char_start < s.end]
        assert offsets[k] / RATE <= span.start <= span.end <= offsets[k + 1] / RATE  # inside its audio


def test_language_and_document(tmp_path: Path) -> None:
    text = "Hello there"
    segment = OfflineSegment(0, len(text), 1, 1, "EOS", 1920)
    result = OfflineResult(np.zeros((1, 16), np.int64), np.zeros(1920, np.float32), [segment])
    spans = align_result(EvenAligner(), result, text, RATE, "auto")
    document = timestamps_document(spans, text, 0.08, "word")
    write_timestamps(tmp_path / "out" / "t.json", document)
    loaded = json.loads((tmp_path / "out" / "t.json").read_text())
    assert loaded["text"] == text and loaded["duration"] == 0.08
    assert [(w["text"], w["char_start"], w["char_end"]) for w in loaded["words"]] == [
        ("Hello", 0, 5),
        ("there", 6, 11),
    ]
    assert loaded["words"][0]["start"] == 0 and loaded["words"][-1]["end"] == 0.08
    assert "characters" in timestamps_document(spans, text, 0.08, "character")
