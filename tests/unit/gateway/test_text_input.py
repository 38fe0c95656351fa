"""The streamed text cut into utterances (gateway.text_input.UtteranceCutter): the talker gets the
client's text exactly, whatever the split into deltas; long streams are cut at sentence
boundaries within the size; flush and cancel."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.synthesis.text_cutter import (
    AppendUtteranceText,
    EndUtterance,
    OpenUtterance,
    TextAction,
    UtteranceCutter,
)
from tests.helpers.synthesis import cut
from tts_common.text import estimate_tokens, split_sentences
from tts_common.text.chars import is_speakable

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Dr. Smith measured 3.14 metres at 12:30, e.g. twice.",
    "Is it done?",
    "Yes!",
    "Then we went home, slowly, along the river and over the old stone bridge.",
    "See www.example.com for more.",
    "今天天气很好，我们去公园散步吧！",
    "“Come in,” he said.",
]


def utterances_of(actions: list[TextAction]) -> list[tuple[int, str, bool]]:
    """(start, text, ended) of each utterance the actions describe, checking their order."""
    out: list[tuple[int, str, bool]] = []
    for action in actions:
        if isinstance(action, OpenUtterance):
            assert not out or out[-1][2], "an utterance opened while another is open"
            out.append((action.start, action.text, False))
        elif isinstance(action, AppendUtteranceText):
            assert out and not out[-1][2]
            start, text, _ = out[-1]
            out[-1] = (start, text + action.text, False)
        else:
            assert isinstance(action, EndUtterance) and out and not out[-1][2]
            start, text, _ = out[-1]
            out[-1] = (start, text, True)
    return out


def speakable_prefix(text: str) -> str:
    """``text`` up to its last letter or digit."""
    last = max(i for i, ch in enumerate(text) if is_speakable(ch))
    return text[: last + 1]


def feed(cutter: UtteranceCutter, deltas: list[str]) -> list[TextAction]:
    actions: list[TextAction] = []
    for delta in deltas:
        actions += cutter.push(delta)
    return actions + cutter.flush()


def split_at(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at ``cuts`` (wrapped into its length), without empty pieces."""
    return cut(text, {c % (len(text) + 1) for c in cuts} - {0, len(text)})


@given(text=st.text(max_size=30), data=st.data())
def test_cut_pieces_join_back_at_the_points(text: str, data: st.DataObject) -> None:
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=6))
    pieces = cut(text, points)
    assert "".join(pieces) == text and len(pieces) == len(points) + 1
    ends = [sum(len(p) for p in pieces[: k + 1]) for k in range(len(points))]
    assert ends == sorted(points)


@settings(max_examples=400, deadline=None)
@given(
    sentences=st.lists(st.sampled_from(SENTENCES), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=40),
    size=st.integers(min_value=30, max_value=120),
)
def test_any_split_gives_the_same_utterances(sentences: list[str], cuts: list[int], size: int) -> None:
    text = " ".join(sentences)
    whole = utterances_of(feed(UtteranceCutter(size, estimate_tokens), [text]))
    split = utterances_of(feed(UtteranceCutter(size, estimate_tokens), split_at(text, cuts)))
    assert split == whole
    assert all(ended for _, _, ended in whole)
    for start, utterance, _ in whole:
        assert text[start : start + len(utterance)] == utterance
        # Within the size but for trailing whitespace and punctuation (never cut off alone).
        assert estimate_tokens(speakable_prefix(utterance)) <= size
    assert "".join(u for _, u, _ in whole) == text  # the whitespace at a cut ends an utterance
    # Sentences of at most half an utterance are never cut.
    if max(estimate_tokens(s) for s in sentences) <= size // 2:
        sentence_starts = {s.start for s in split_sentences(text)} | {len(text)}
        assert all(start + len(u) in sentence_starts for start, u, _ in whole)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_text_within_half_a_segment_is_forwarded_at_once_and_whole(cuts: list[int]) -> None:
    text = "  Hello there, " + SENTENCES[0] + "\n"
    cutter = UtteranceCutter(400, estimate_tokens)
    forwarded = ""
    for delta in split_at(text, cuts):
        for action in cutter.push(delta):
            assert isinstance(action, OpenUtterance | AppendUtteranceText)
            forwarded += action.text
        # Everything received is forwarded but a partial last word (the talker could not
        # tokenize it yet anyway).
        assert text.startswith(forwarded)
        if forwarded:
            held = text[len(forwarded) : cutter.offset]
            assert re.search(r"\s", held) is None, held
    end = cutter.flush()
    assert isinstance(end[-1], EndUtterance)
    assert utterances_of(feed(UtteranceCutter(400, estimate_tokens), split_at(text, cuts))) == [
        (0, text, True)
    ]


def test_flush_starts_a_new_utterance_and_cancel_drops_the_held_text() -> None:
    cutter = UtteranceCutter(100, estimate_tokens)
    actions = cutter.push("One two.") + cutter.flush() + cutter.push(" Three ")
    assert utterances_of(actions) == [(0, "One two.", True), (8, " Three ", False)]
    assert cutter.is_open
    cutter.cancel()
    assert not cutter.is_open
    assert utterances_of(cutter.push("Four.") + cutter.flush()) == [(15, "Four.", True)]
    # Whitespace or punctuation alone is no utterance.
    assert cutter.push("  ") + cutter.flush() == []
    assert cutter.push("...") + cutter.flush() == []


def test_a_sentence_longer_than_a_segment_is_cut_like_a_long_text() -> None:
    sentence = "word, " * 60 + "end."
    actions = feed(UtteranceCutter(20, estimate_tokens), [sentence])
    pieces = utterances_of(actions)
    assert len(pieces) > 1
    assert all(estimate_tokens(text) <= 20 for _, text, _ in pieces)
    assert "".join(text for _, text, _ in pieces) == sentence
