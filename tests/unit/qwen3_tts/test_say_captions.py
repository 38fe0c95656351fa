"""``qwen3-tts say --captions``: the flag takes .srt or .vtt only, asks for word timestamps, and
a ``timestamps`` response becomes words in seconds of the audio as sent; the streamed text the
spans index is recorded as it is sent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3_tts.cli import build_parser
from qwen3_tts.client import TextRecorder, build_request, timed_words
from tts_common.pb.qwen3tts.v1 import tts_pb2


def test_captions_flag_asks_for_word_timestamps(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    args = parse(["say", "Hi there.", "--captions", "out.vtt"])
    assert build_request(args).timestamps == tts_pb2.TIMESTAMP_UNIT_WORD
    assert build_request(parse(["say", "Hi there."])).timestamps == tts_pb2.TIMESTAMP_UNIT_UNSPECIFIED
    with pytest.raises(SystemExit):
        parse(["say", "Hi.", "--captions", "out.txt"])
    assert ".srt or .vtt" in capsys.readouterr().err


@given(
    rate=st.sampled_from([8000, 16000, 24000, 44100, 48000]),
    samples=st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 10**5)), max_size=20),
)
def test_timed_words_are_in_seconds_of_the_audio_as_sent(rate: int, samples: list[tuple[int, int]]) -> None:
    message = tts_pb2.Timestamps(
        index=0,
        unit=tts_pb2.TIMESTAMP_UNIT_WORD,
        units=[
            tts_pb2.TimedUnit(text=f"w{k}", char_start=k, char_end=k + 1, start_sample=s, end_sample=s + d)
            for k, (s, d) in enumerate(samples)
        ],
    )
    words = timed_words(message, rate)
    assert [(w.text, w.char_start, w.char_end) for w in words] == [
        (f"w{k}", k, k + 1) for k in range(len(samples))
    ]
    for word, (start, length) in zip(words, samples):
        assert round(word.start * rate) == start and round(word.end * rate) == start + length


def test_text_recorder_keeps_what_was_sent() -> None:
    recorder = TextRecorder(iter(["Hel", "lo, wor", "ld."]))
    assert list(recorder) == ["Hel", "lo, wor", "ld."]
    assert recorder.text == "Hello, world."
