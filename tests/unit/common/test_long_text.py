"""Long text: segment sizes, derived seeds, per-segment plans (tts_common.synthesis.segments) and
the silence stop (tts_common.silence)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.fake_stages import model_info
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.request_ids import MAX_REQUEST_ID_CHARS
from tts_common.silence import SilenceDetector, SilenceStop, frame_level_dbfs, silence_stop_sample
from tts_common.synthesis import RUNAWAY_GUARD
from tts_common.synthesis.segments import (
    FIRST_SEGMENT_PREFIX_CHARS,
    PROMPT_FIXED_POSITIONS,
    first_segment,
    max_segment_tokens,
    plan_segments,
    prompt_overhead,
    request_segment_size,
    segment_request_id,
    segment_seed,
    segment_size,
)
from tts_common.synthesis.validation import RequestLimits, effective_model_info, plan_synthesis
from tts_common.text import NothingToSpeakError, WordTooLongError, estimate_tokens

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------- seeds and ids


def test_segment_seed_is_splitmix64() -> None:
    # SplitMix64's published first outputs for state 0 (Vigna's reference implementation):
    # segment k's seed is the k-th output's top 31 bits.
    outputs = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [segment_seed(0, k) for k in (1, 2, 3)] == [o >> 33 for o in outputs]


@PROPERTY
@given(seed=st.integers(0, 2**64 - 1), index=st.integers(0, 10_000))
def test_segment_seed_rule(seed: int, index: int) -> None:
    derived = segment_seed(seed, index)
    assert segment_seed(seed, index) == derived  # a pure function: a request replays
    if index == 0:
        assert derived == seed  # one segment is generated exactly as before
    else:
        assert 0 <= derived < 2**31
    if index >= 2:
        # The state advances by the golden gamma per segment: segment k of seed s is segment
        # k - 1 of seed s + gamma (mod 2^64).
        assert derived == segment_seed((seed + 0x9E3779B97F4A7C15) % 2**64, index - 1)


def test_segment_seeds_differ_within_a_request() -> None:
    seeds = [segment_seed(12345, k) for k in range(1, 2000)]
    assert len(set(seeds)) == len(seeds)


@given(request_id=st.text(min_size=1, max_size=MAX_REQUEST_ID_CHARS), index=st.integers(0, 10**6))
def test_segment_request_id(request_id: str, index: int) -> None:
    rid = segment_request_id(request_id, index)
    if index == 0:
        assert rid == request_id
    else:
        assert rid.endswith(f"/{index}") and len(rid) <= MAX_REQUEST_ID_CHARS
        assert request_id.startswith(rid.removesuffix(f"/{index}"))


# ---------------------------------------------------------------------------- segment size


def test_default_segment_size() -> None:
    # The documented figure: 2048-position slot, nothing but the text in the prompt.
    assert max_segment_tokens(2048, PROMPT_FIXED_POSITIONS) == 173
    assert segment_size(2048, PROMPT_FIXED_POSITIONS) == 173
    assert segment_size(2048, PROMPT_FIXED_POSITIONS, configured=50) == 50
    assert segment_size(2048, PROMPT_FIXED_POSITIONS, configured=5000) == 173


@PROPERTY
@given(max_seq_len=st.integers(1, 40_000), overhead=st.integers(0, 5000))
def test_max_segment_tokens_is_the_largest_that_fits(max_seq_len: int, overhead: int) -> None:
    def fits(tokens: int) -> bool:
        return tokens + overhead + RUNAWAY_GUARD.frames(tokens) + 1 <= max_seq_len

    largest = max_segment_tokens(max_seq_len, overhead)
    if largest == 0:
        assert not fits(1)
        with pytest.raises(InvalidRequestError, match=f"take {overhead} prompt positions"):
            segment_size(max_seq_len, overhead)
    else:
        assert fits(largest) and not fits(largest + 1)


def test_prompt_overhead_counts_instruct_and_reference() -> None:
    assert prompt_overhead(estimate_tokens) == PROMPT_FIXED_POSITIONS
    with_instruct = prompt_overhead(estimate_tokens, instruct="A calm voice.")
    assert with_instruct > PROMPT_FIXED_POSITIONS
    # A reference counts only in-context (with frames); its frames count one position each.
    assert prompt_overhead(estimate_tokens, ref_text="Hi.", ref_frames=0) == PROMPT_FIXED_POSITIONS
    a = prompt_overhead(estimate_tokens, ref_text="Hi.", ref_frames=10)
    assert prompt_overhead(estimate_tokens, ref_text="Hi.", ref_frames=30) == a + 20


@PROPERTY
@given(
    ref_frames=st.integers(0, 1500),
    ref_text=st.sampled_from(["", "Hi.", "A longer reference transcript, read aloud."]),
    max_seq_len=st.sampled_from([0, 1024, 2048, 8192]),
    configured=st.integers(0, 400),
)
def test_request_segment_size_sizes_the_prompt_of_the_request(
    ref_frames: int, ref_text: str, max_seq_len: int, configured: int
) -> None:
    # The gateway's and the offline command's segment size: the reference counts by its frames,
    # an unknown slot (0) is the default one.
    plan = plan_of("Hello there.")
    codes = stages_pb2.Codes(num_frames=ref_frames) if ref_frames else None
    overhead = prompt_overhead(estimate_tokens, ref_text=ref_text, ref_frames=ref_frames)
    slot = max_seq_len or 2048
    kwargs = {"ref_text": ref_text, "ref_codes": codes, "max_seq_len": max_seq_len, "configured": configured}
    if max_segment_tokens(slot, overhead) < 1:
        with pytest.raises(InvalidRequestError):
            request_segment_size(estimate_tokens, plan, **kwargs)
    else:
        assert request_segment_size(estimate_tokens, plan, **kwargs) == segment_size(
            slot, overhead, configured
        )


# ---------------------------------------------------------------------------- segment plans

INFO = effective_model_info(model_info("custom_voice"))


def plan_of(text: str, seed: int = 7, **kwargs: object):
    request = tts_pb2.SynthesizeRequest(
        text=text, speaker="Vivian", sampling=tts_pb2.SamplingOptions(seed=seed), **kwargs
    )
    return plan_synthesis(request, INFO, RequestLimits())


def test_a_text_that_fits_is_one_segment_unchanged() -> None:
    plan = plan_of("  Hello there. How are you?\n")
    [segment] = plan_segments(plan, 173, estimate_tokens)
    assert segment.plan is plan  # whole, surrounding whitespace included, same seed
    assert (segment.index, segment.start, segment.end, segment.seed) == (0, 0, len(plan.text), 7)


@PROPERTY
@given(
    sentences=st.lists(
        st.text(alphabet="abcdefgh ", min_size=1, max_size=30).map(lambda s: "W" + s.strip() + "."),
        min_size=1,
        max_size=40,
    ),
    max_tokens=st.integers(12, 60),
    seed=st.integers(0, 2**64 - 1),
)
def test_segments_tile_the_text_with_derived_seeds(sentences: list[str], max_tokens: int, seed: int) -> None:
    text = " ".join(sentences)
    plan = plan_of(text, seed=seed)
    segments = plan_segments(plan, max_tokens, estimate_tokens)
    if len(segments) == 1:
        assert segments[0].plan is plan
        return
    for k, segment in enumerate(segments):
        assert segment.index == k
        assert segment.plan.text == text[segment.start : segment.end]
        assert estimate_tokens(segment.plan.text) <= max_tokens
        assert segment.seed == segment_seed(seed, k)
        # Everything else is the request's.
        assert segment.plan.sampling.replace(seed=seed) == plan.sampling
        assert (segment.plan.speaker, segment.plan.language, segment.plan.text_feeding) == (
            plan.speaker,
            plan.language,
            plan.text_feeding,
        )
    assert "".join(s.plan.text for s in segments).replace(" ", "") == text.replace(" ", "")
    assert all(a.end <= b.start for a, b in zip(segments, segments[1:]))


_PIECES = st.sampled_from(
    [
        "Mr.",
        "Dr. Who",
        "1,000",
        "12:30",
        "e.g.",
        "...",
        "\u2026",
        "!",
        "?",
        ";",
        ",",
        ":",
        '"',
        "\u201d",
        "(",
        ")",
        "\n",
        "\n\n",
        "\u3002",
        "\uff0c",
        "\u4f60\u597d",
        "\u6c49\u5b57",
        "a",
        "b",
        "Wor",
        "ld",
        " ",
        "  ",
        "x.y",
        "-",
        " - ",
    ]
)


@PROPERTY
@given(
    pieces=st.lists(_PIECES, min_size=20, max_size=400),
    max_tokens=st.integers(2, 12),
    data=st.data(),
)
def test_first_segment_from_a_prefix_is_the_whole_texts_first(
    pieces: list[str], max_tokens: int, data: st.DataObject
) -> None:
    """The gateway starts a long text on first_segment's segment before plan_segments has read
    the whole text: it must be exactly plan_segments' first, whatever the text and wherever the
    prefix ends."""
    text = "Start " + "".join(pieces)
    plan = plan_of(text)
    prefix_chars = data.draw(st.integers(1, len(text)), label="prefix_chars")
    first = first_segment(plan, max_tokens, estimate_tokens, prefix_chars)
    try:
        segments = plan_segments(plan, max_tokens, estimate_tokens)
    except InvalidRequestError:
        return  # refused as a whole; the gateway reports it before any response
    if first is not None:
        assert first == segments[0]


def test_first_segment_settles_a_chapter_from_its_start() -> None:
    sentence = "The quick brown fox jumps over the lazy dog, and the dog sleeps on. "
    text = sentence * 400  # 27,600 characters
    plan = plan_of(text, seed=11)
    first = first_segment(plan, 60, estimate_tokens)
    assert first is not None and first == plan_segments(plan, 60, estimate_tokens)[0]
    assert first.end < 60 * FIRST_SEGMENT_PREFIX_CHARS
    assert first_segment(plan_of(sentence * 3), 60, estimate_tokens) is None  # short: no prefix


def test_bad_texts() -> None:
    with pytest.raises(NothingToSpeakError):
        plan_segments(plan_of("... ?! —"), 173, estimate_tokens)
    with pytest.raises(WordTooLongError, match="tokens"):
        plan_segments(plan_of("Hi " + "x" * 2000), 173, estimate_tokens)
    with pytest.raises(InvalidRequestError, match=r"text is too long: 100001 characters \(maximum 100000\)"):
        plan_of("a" * 100_001)


# ---------------------------------------------------------------------------- silence stop

RATE, FRAME = 24000, 1920
RULE = SilenceStop(threshold_dbfs=-45.0, seconds=2.0)
LIMIT = math.ceil(2.0 * RATE / FRAME)  # 25 silent frames


def frames(levels: list[float]) -> np.ndarray:
    """One frame per entry: a sine with that peak amplitude (0: digital silence)."""
    t = np.arange(FRAME) / RATE
    return np.concatenate([a * np.sin(2 * np.pi * 440 * t) for a in levels]).astype(np.float32)


def test_frame_level() -> None:
    assert frame_level_dbfs(np.zeros(10, np.float32)) == -math.inf
    assert frame_level_dbfs(np.ones(10, np.float32)) == 0.0
    assert abs(frame_level_dbfs(frames([0.1])) - 20 * math.log10(0.1 / math.sqrt(2))) < 0.01


def test_stops_after_the_configured_silence_after_speech() -> None:
    audio = frames([0.3] * 5 + [0.0] * 40)
    assert SilenceDetector(RULE, RATE, FRAME).limit_frames == LIMIT
    assert silence_stop_sample(audio, RULE, RATE, FRAME) == (5 + LIMIT) * FRAME
    # A pause shorter than the limit, then speech: no stop.
    assert silence_stop_sample(frames([0.3] + [0.0] * (LIMIT - 1) + [0.3]), RULE, RATE, FRAME) is None
    # Silence before any sound never stops.
    assert silence_stop_sample(frames([0.0] * 60 + [0.3]), RULE, RATE, FRAME) is None
    # Near-silence below the threshold counts as silence; quiet speech above it does not.
    quiet = 10 ** (-50 / 20) * math.sqrt(2)  # -50 dBFS RMS
    audible = 10 ** (-40 / 20) * math.sqrt(2)
    assert silence_stop_sample(frames([0.3] + [quiet] * LIMIT), RULE, RATE, FRAME) == (1 + LIMIT) * FRAME
    assert silence_stop_sample(frames([0.3] + [audible] * 40), RULE, RATE, FRAME) is None


@PROPERTY
@given(
    levels=st.lists(st.sampled_from([0.0, 0.001, 0.3]), min_size=1, max_size=80),
    cuts=st.lists(st.integers(0, 80 * FRAME), max_size=8),
    seconds=st.sampled_from([0.08, 0.5, 2.0]),
)
def test_the_stop_does_not_depend_on_chunking(levels: list[float], cuts: list[int], seconds: float) -> None:
    rule = SilenceStop(-45.0, seconds)
    audio = frames(levels)
    whole = silence_stop_sample(audio, rule, RATE, FRAME)
    # The reference decision, frame by frame.
    limit, heard, run, expected = math.ceil(seconds * RATE / FRAME - 1e-9), False, 0, None
    for i, level in enumerate(levels):
        if level == 0.3:
            heard, run = True, 0
        elif heard:
            run += 1
            if run >= limit:
                expected = (i + 1) * FRAME
                break
    assert whole == expected
    detector, kept, stop = SilenceDetector(rule, RATE, FRAME), 0, None
    bounds = sorted({0, audio.size, *(c for c in cuts if c <= audio.size)})
    for a, b in zip(bounds, bounds[1:]):
        keep = detector.push(audio[a:b])
        if keep is not None:
            assert 0 <= keep <= b - a
            stop = kept + keep
            break
        kept += b - a
    assert stop == whole


def test_never_triggers_on_the_parity_fixtures() -> None:
    # The official outputs of every fixture request (what the parity tests compare against): the
    # default silence stop leaves each whole, so their codes and audio stay identical.
    from tests.helpers.fixtures import REFERENCE_DIR
    from tts_common.silence import DEFAULT_SILENCE_STOP

    wavs = sorted(REFERENCE_DIR.glob("*/*/wav_*.npy"))
    assert len(wavs) >= 20
    for path in wavs:
        audio = np.load(path).astype(np.float32)
        levels = [frame_level_dbfs(audio[i : i + FRAME]) for i in range(0, audio.size - FRAME + 1, FRAME)]
        assert max(levels) >= DEFAULT_SILENCE_STOP.threshold_dbfs  # it has speech: the stop is armed
        assert silence_stop_sample(audio, DEFAULT_SILENCE_STOP, RATE, FRAME) is None, path
