"""Incremental text input: the incremental tokenizer's commit rule (committed tokens of any split
== the whole text's tokens), NFC boundaries, and through the engine: codes of a text streamed in
any split at any timing == one request of the whole text with streaming feeding (greedy and
sampled, every fixture checkpoint type, official outputs included); waiting keeps the slot while
others decode; cancellation while waiting or before the start; misuse errors."""

from __future__ import annotations

import dataclasses
import time
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from talker_service.engine import EngineConfig, FinishReason, TalkerEngine
from talker_service.engine import engine as engine_module
from talker_service.engine.request import EngineRequest
from talker_service.engine.text_feed import TextFeed
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import PromptInputs, tokens_to_start
from talker_service.model.streaming_text import IncrementalTokenizer
from talker_service.model.unicode_boundaries import boundary_after, boundary_before
from tests.helpers.fixtures import (
    CHECKPOINT_NAMES,
    CKPT_DIR,
    fixture_case,
    fixture_prompt_inputs,
    load_requests,
)
from tests.helpers.stack import wait_for
from tests.helpers.synthesis import cut
from tests.helpers.talker import Collector
from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.synthesis import SamplingParams
from tts_common.text.tokenizer import ROLE_TOKENS, TextTokenizer

# Pieces chosen to hit every rule: line breaks and whitespace runs (the split regex's
# backtracking), contractions, digits, punctuation runs, combining marks and composing
# characters (NFC), Hangul jamo, CJK, added tokens and their prefixes.
PIECES = [
    *"ab ce\n\r\t.,!?'1",
    "hello",
    "world",
    " the",
    "'s",
    "'ll",
    "  ",
    "\n\n",
    " \n ",
    "42",
    "...",
    "é",
    "e\u0301",
    "\u0301",
    "\u0327",
    "\u0338",
    "=",
    "\u1100",
    "\u1161",
    "\u11a8",
    "가",
    "你好",
    "。",
    "\u00a0",
    "<|im_end|>",
    "<|im_start|>",
    "<|im_",
    "<|",
    "|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_checkpoint(CKPT_DIR / "tiny_base")


def _splits(draw, text: str) -> list[str]:
    """``text`` in up to 9 pieces, an empty first or last one included."""
    return cut(text, draw(st.sets(st.integers(0, len(text)), max_size=8)))


@st.composite
def split_texts(draw, pieces: list[str] = PIECES, max_pieces: int = 14) -> tuple[str, list[str]]:
    text = "".join(draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=max_pieces)))
    return text, _splits(draw, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=split_texts())
def test_committed_tokens_of_any_split_are_the_whole_texts(tokenizer, case):
    text, deltas = case
    inc = IncrementalTokenizer(tokenizer)
    ids: list[int] = []
    for delta in deltas:
        ids += inc.push(delta)
        # Never ahead of the truth: what is committed is a prefix of the whole text's tokens.
        assert ids == tokenizer.text_ids(text)[: len(ids)]
    ids += inc.finish()
    assert ids == tokenizer.text_ids(text)
    assert inc.committed == len(ids)
    if ids:
        assert inc.role_ids == tokenizer.synthesis_ids(text)[:ROLE_TOKENS]


def test_tokens_are_committed_before_the_end(tokenizer):
    inc = IncrementalTokenizer(tokenizer)
    ids = inc.push("Hello there, my fri")
    # Everything but the last pre-token ("fri", which may grow) is final.
    assert ids == tokenizer.text_ids("Hello there, my")
    assert inc.pending == " fri"
    assert inc.push("end") == []
    assert inc.push(".") == tokenizer.encode(" friend")  # "." may still take "\n" after it
    assert inc.push(" ") == tokenizer.encode(".")  # the space may still grow
    assert inc.finish() == tokenizer.encode(" ")
    inc = IncrementalTokenizer(tokenizer)
    assert inc.push("a<|im_") == []  # may still become <|im_end|>, and "a" is the last pre-token
    assert inc.push("end|> b c") == tokenizer.text_ids("a<|im_end|> b")


_NFC_ALPHABET = "aeoAKᄀ가\u0301\u0327\u0338\u1161\u11a8=<ñ\u0cc6\u0cc2\u0cd5"
"""Letters, composing marks, Hangul jamo and syllables, and Kannada's chained composition."""


@settings(max_examples=300, deadline=None)
@given(
    a=st.text(alphabet=st.sampled_from(_NFC_ALPHABET), max_size=4),
    c=st.sampled_from(_NFC_ALPHABET + " 1\u0f73\u0344"),
    b=st.text(alphabet=st.sampled_from(_NFC_ALPHABET), max_size=4),
)
@example(a="ᄀ", c="\u1161", b="\u11a8").via("L + V + T compose into one syllable")
@example(a="\u0cc6", c="\u0cc2", b="\u0cd5").via("a chained composition outside Hangul")
def test_nfc_boundaries(a, c, b):
    def nfc(s: str) -> str:
        return unicodedata.normalize("NFC", s)

    if boundary_before(c):
        assert nfc(a + c + b) == nfc(a) + nfc(c + b)
    if boundary_after(c):
        assert nfc(a + c + b) == nfc(a + c) + nfc(b)


# --- through the engine --------------------------------------------------------------------------

MAX_NEW_TOKENS = 25  # 24 frames: enough to run past the text of short examples, keeps tests fast
WORDS = [
    "Hello",
    " there",
    ",",
    " my",
    " friend",
    ".",
    " How",
    " are",
    " you",
    "?",
    " 你好",
    "。",
    "\n",
    " 42",
]


@pytest.fixture(scope="module")
def engines():
    started = {}
    for name in CHECKPOINT_NAMES:
        engine = TalkerEngine(
            TalkerModel.from_checkpoint(CKPT_DIR / name), EngineConfig(max_slots=4, max_seq_len=256)
        )
        engine.start()
        started[name] = engine
    yield started
    for engine in started.values():
        engine.stop()


def _wait_until(predicate, timeout: float = 30.0) -> None:
    assert wait_for(predicate, timeout, interval=0.001), "condition not reached"


def _stalled(request: EngineRequest) -> bool:
    return request.finished or (request.slot is not None and request.waiting_for_text)


def _feed(engine: TalkerEngine, request: EngineRequest, feed: TextFeed, deltas, pauses) -> None:
    """Send ``deltas``, each after its pause: "now", a short sleep, or until the request has used
    up its text and waits (a pause longer than a decode step, others decoding meanwhile)."""
    for delta, pause in zip(deltas, pauses):
        if pause == "sleep":
            time.sleep(0.003)
        elif pause == "stall":
            # Not started yet: until the engine has taken the text so far (and found it short).
            _wait_until(lambda: _stalled(request) or (request.prompt is None and not feed.unread))
        feed.append(delta)
    feed.end()


def _streamed_equals_whole(engine, source: PromptInputs, deltas, pauses, sampling) -> EngineRequest:
    """Run the whole-text request (streaming feeding) and the streamed one side by side: the
    whole one decodes while deltas arrive; batch invariance makes its codes those it has alone."""
    source = dataclasses.replace(source, non_streaming_text=False)
    whole, streamed = Collector(), Collector()
    engine.add("whole", source, sampling, MAX_NEW_TOKENS, whole)
    feed = TextFeed()
    request = engine.add(
        "streamed", dataclasses.replace(source, text=""), sampling, MAX_NEW_TOKENS, streamed, text=feed
    )
    _feed(engine, request, feed, deltas, pauses)
    assert streamed.wait().error is None and whole.wait().error is None
    assert streamed.done.reason == whole.done.reason
    assert streamed.frames == whole.frames
    return request


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_streamed_text_codes_equal_whole_text(engines, name, data):
    # Every voice kind of the checkpoint (preset, design, x-vector and in-context clones).
    line = data.draw(st.sampled_from(load_requests(name)), label="voice")
    text = "".join(data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=18), label="words"))
    deltas = _splits(data.draw, text)
    pauses = data.draw(
        st.lists(st.sampled_from(["now", "sleep", "stall"]), min_size=len(deltas), max_size=len(deltas))
    )
    sampled = data.draw(st.booleans(), label="sampled")
    sampling = (
        SamplingParams(seed=data.draw(st.integers(0, 2**31 - 1)), temperature=0.9, top_k=50, top_p=0.95)
        if sampled
        else SamplingParams.greedy()
    )
    source = dataclasses.replace(fixture_prompt_inputs(name, line), text=text)
    _streamed_equals_whole(engines[name], source, deltas, pauses, sampling)


def test_in_context_clone_starts_before_the_text_ends(engines):
    """An in-context clone starts once 1 + reference frames tokens (transcript included) are
    known, and streams exactly."""
    name = "tiny_base"
    line = _line(name, "vc_icl_stream")
    text = " ".join(["Hello there my friend"] * 8)
    source = dataclasses.replace(fixture_prompt_inputs(name, line), text=text)
    deltas = [text[i : i + 5] for i in range(0, len(text), 5)]
    request = _streamed_equals_whole(
        engines[name], source, deltas, ["stall"] * len(deltas), SamplingParams.greedy()
    )
    assert request.timing.stalls > 0  # it ran out of text while the text was open


def test_tokens_to_start_is_computed_once_per_request(engines, monkeypatch):
    """The start threshold (an in-context clone re-tokenizes its reference transcript for it) is
    computed when the request is admitted, not at every step while it waits for text."""
    calls = []

    def counted(tokenizer, req):
        calls.append(req.text)
        return tokens_to_start(tokenizer, req)

    monkeypatch.setattr(engine_module, "tokens_to_start", counted)
    name = "tiny_base"
    text = " ".join(["Hello there my friend"] * 8)
    source = dataclasses.replace(fixture_prompt_inputs(name, _line(name, "vc_icl_stream")), text=text)
    deltas = [text[i : i + 5] for i in range(0, len(text), 5)]
    _streamed_equals_whole(engines[name], source, deltas, ["stall"] * len(deltas), SamplingParams.greedy())
    assert calls == [""]  # the streamed request's, once (the whole one's prompt is built at once)


@pytest.mark.parametrize(
    "name,line_id",
    [
        ("tiny_custom_voice", "cv_en_serena_stream"),
        ("tiny_voice_design", "vd_zh_stream"),
        ("tiny_base", "vc_xvec_stream"),
        ("tiny_base", "vc_icl_stream"),
    ],
)
def test_streamed_text_matches_official_streaming_outputs(engines, name, line_id):
    line = _line(name, line_id)
    source = fixture_prompt_inputs(name, line)
    assert not source.non_streaming_text
    case, i = fixture_case(name, line)
    expected = np.load(case / f"codes_{i}.npy")
    text = source.text
    deltas = [text[j : j + 3] for j in range(0, len(text), 3)]  # mid-word, mid-character-sequence
    sink, feed = Collector(), TextFeed()
    engine = engines[name]
    request = engine.add(
        "s", dataclasses.replace(source, text=""), SamplingParams.greedy(), 80, sink, text=feed
    )
    _feed(engine, request, feed, deltas, ["stall" if j % 2 else "now" for j in range(len(deltas))])
    sink.wait()
    np.testing.assert_array_equal(
        np.array(sink.frames, dtype=np.int64).reshape(-1, expected.shape[1]), expected
    )


def _line(name: str, case: str) -> dict:
    """The fixture request line of ``name`` whose id is ``case`` (ids are ``case.<index>``)."""
    return next(line for line in load_requests(name) if line["id"].split(".")[0] == case)


def _voice(name: str = "tiny_custom_voice") -> PromptInputs:
    line = _line(name, "cv_en_serena_stream")
    return dataclasses.replace(fixture_prompt_inputs(name, line), text="")


def test_waiting_request_keeps_its_slot_while_others_decode(engines):
    engine = engines["tiny_custom_voice"]
    sink, feed = Collector(), TextFeed()
    request = engine.add("s", _voice(), SamplingParams.greedy(), 60, sink, text=feed)
    feed.append("Hello there, my")  # "Hello there," committed; " my" may still grow
    _wait_until(lambda: _stalled(request))
    slot, frames = request.slot, len(sink.frames)
    assert slot is not None and not request.finished
    steps = engine.steps
    other = Collector()
    engine.add(
        "other",
        dataclasses.replace(_voice(), text="Good morning to you all."),
        SamplingParams.greedy(),
        20,
        other,
    )
    assert other.wait().reason in (FinishReason.EOS, FinishReason.LENGTH) and other.frames
    assert engine.steps >= steps + len(other.frames)  # others decoded...
    assert len(sink.frames) == frames and request.slot == slot  # ...while it waited in its slot
    assert engine.stats().running == 1
    feed.append(" friend.")
    feed.end()
    done = sink.wait()
    assert done.reason in (FinishReason.EOS, FinishReason.LENGTH) and len(sink.frames) > frames
    assert done.timing.stalls >= 1 and done.timing.text_wait > 0


def test_cancel_while_waiting_frees_the_slot(engines):
    engine = engines["tiny_custom_voice"]
    sink, feed = Collector(), TextFeed()
    request = engine.add("s", _voice(), SamplingParams.greedy(), 60, sink, text=feed)
    feed.append("Hello there, my")
    _wait_until(lambda: _stalled(request))
    assert engine.stats().running == 1
    engine.cancel(request)
    assert sink.wait().reason is FinishReason.CANCELLED
    _wait_until(lambda: engine.stats().running == 0, timeout=5)
    feed.append(" more")  # after the end of the request: ignored, no error
    feed.end()


def test_cancel_before_the_start(engines):
    engine = engines["tiny_base"]
    line = _line("tiny_base", "vc_icl_stream")
    sink, feed = Collector(), TextFeed()
    source = dataclasses.replace(fixture_prompt_inputs("tiny_base", line), text="Hello")
    request = engine.add("s", source, SamplingParams.greedy(), 60, sink, text=feed)
    feed.append(" there")  # far fewer tokens than the in-context clone needs to start
    time.sleep(0.05)
    assert request.prompt is None and engine.stats().waiting == 1
    engine.cancel(request)
    assert sink.wait().reason is FinishReason.CANCELLED and sink.frames == []
    _wait_until(lambda: engine.stats().waiting == 0, timeout=5)


def test_non_streaming_feeding_starts_at_the_end_of_the_text(engines):
    engine = engines["tiny_custom_voice"]
    source = dataclasses.replace(_voice(), text="Hello there, my friend.", non_streaming_text=True)
    whole = Collector()
    engine.add("whole", source, SamplingParams.greedy(), MAX_NEW_TOKENS, whole)
    sink, feed = Collector(), TextFeed()
    request = engine.add(
        "s",
        dataclasses.replace(source, text="Hello there"),
        SamplingParams.greedy(),
        MAX_NEW_TOKENS,
        sink,
        text=feed,
    )
    feed.append(", my friend.")
    time.sleep(0.05)
    assert request.prompt is None  # the whole text is in a non-streaming prompt
    feed.end()
    assert sink.wait().error is None and whole.wait().error is None
    assert sink.frames == whole.frames


def test_text_feed_misuse_and_empty_text(engines):
    feed = TextFeed()
    feed.append("a")
    feed.end()
    with pytest.raises(FailedPreconditionError, match="AppendText after EndText"):
        feed.append("b")
    with pytest.raises(FailedPreconditionError, match="EndText was sent twice"):
        feed.end()
    engine = engines["tiny_custom_voice"]
    sink, feed = Collector(), TextFeed()
    engine.add("s", _voice(), SamplingParams.greedy(), 20, sink, text=feed)
    feed.append("")  # empty deltas are allowed, and the text ends with nothing in it
    feed.end()
    done = sink.wait()
    assert done.reason is FinishReason.ERROR
    assert isinstance(done.error, InvalidRequestError) and "no tokens" in str(done.error)
    with pytest.raises(ValueError, match="PromptInputs"):
        engine.add(
            "s",
            engine.model.build_prompt(dataclasses.replace(_voice(), text="a")),
            SamplingParams.greedy(),
            5,
            sink,
            text=TextFeed(),
        )
