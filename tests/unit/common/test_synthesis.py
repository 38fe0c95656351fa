"""The shared synthesis schema: sampling (one spelling, one defaults table, one set of checks), the
frame budget, and planning a request against a model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis import (
    BUILTIN_SAMPLING,
    SAMPLING_FIELDS,
    RunawayGuard,
    SamplingParams,
    check_max_new_tokens,
    frame_budget,
    resolve_sampling,
    sampling_from_generation_config,
    sampling_to_options,
)
from tts_common.synthesis.validation import (
    RequestLimits,
    effective_model_info,
    plan_synthesis,
    talker_request,
)

VALID_VALUES = {
    "do_sample": st.booleans(),
    "temperature": st.floats(min_value=1e-3, max_value=10),
    "top_k": st.integers(min_value=0, max_value=4096),
    "top_p": st.floats(min_value=1e-3, max_value=1.0),
    "repetition_penalty": st.floats(min_value=0.5, max_value=3),
    "subtalker_do_sample": st.booleans(),
    "subtalker_temperature": st.floats(min_value=1e-3, max_value=10),
    "subtalker_top_k": st.integers(min_value=0, max_value=4096),
    "subtalker_top_p": st.floats(min_value=1e-3, max_value=1.0),
    "seed": st.integers(min_value=0, max_value=2**64 - 1),
}


@st.composite
def partial_sampling(draw) -> dict:
    names = draw(st.sets(st.sampled_from(SAMPLING_FIELDS)))
    return {name: draw(VALID_VALUES[name]) for name in names}


@given(defaults=partial_sampling(), explicit=partial_sampling())
def test_explicit_over_defaults_over_builtin(defaults: dict, explicit: dict) -> None:
    base = BUILTIN_SAMPLING.replace(**defaults)
    resolved = resolve_sampling(tts_pb2.SamplingOptions(**explicit), base)
    for name in SAMPLING_FIELDS:
        want = explicit.get(name, defaults.get(name, getattr(BUILTIN_SAMPLING, name)))
        got = getattr(resolved, name)
        assert got == want or math.isclose(got, want, rel_tol=1e-6), name  # proto doubles/floats


@given(partial_sampling())
def test_options_round_trip(values: dict) -> None:
    params = BUILTIN_SAMPLING.replace(**values)
    assert resolve_sampling(sampling_to_options(params), SamplingParams()) == params


@pytest.mark.parametrize("name", ["temperature", "subtalker_temperature", "repetition_penalty"])
@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_positive_fields(name: str, value: float) -> None:
    if math.isfinite(value) and value > 0:
        assert getattr(SamplingParams(**{name: value}), name) == value
    else:
        with pytest.raises(InvalidRequestError, match=rf"sampling\.{name} must be > 0"):
            SamplingParams(**{name: value})


@pytest.mark.parametrize("name", ["top_p", "subtalker_top_p"])
@given(value=st.floats(allow_nan=True))
def test_probability_fields(name: str, value: float) -> None:
    if 0 < value <= 1:
        SamplingParams(**{name: value})
    else:
        with pytest.raises(InvalidRequestError, match=rf"sampling\.{name} must be in \(0, 1\]"):
            SamplingParams(**{name: value})


def test_top_k_and_seed_ranges() -> None:
    with pytest.raises(
        InvalidRequestError, match=r"sampling\.top_k must be >= 0 \(0 disables top-k\), got -1"
    ):
        SamplingParams(top_k=-1)
    with pytest.raises(InvalidRequestError, match=r"sampling\.seed"):
        SamplingParams(seed=-1)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


def test_generation_config_spelling_is_translated_once() -> None:
    sampling, budget = sampling_from_generation_config(
        {"subtalker_dosample": False, "temperature": 0.7, "max_new_tokens": 8192, "unknown": 1, "seed": 3}
    )
    assert sampling.subtalker_do_sample is False and sampling.temperature == 0.7
    assert sampling.seed is None and budget == 8192  # a checkpoint does not pin the seed
    assert sampling_from_generation_config({}) == (BUILTIN_SAMPLING, 2048)


@given(m=st.integers(min_value=2, max_value=10**6), tokens=st.integers(0, 10**4), room=st.integers(-5, 10**5))
def test_frame_budget(m: int, tokens: int, room: int) -> None:
    guard = RunawayGuard(base_frames=125, frames_per_text_token=10)
    assert frame_budget(m, text_tokens=tokens, room=room, guard=guard) == m - 1  # taken literally
    default = frame_budget(None, text_tokens=tokens, room=room, guard=guard)
    assert default == max(min(125 + 10 * max(tokens, 1), room), 0)


@given(value=st.integers(-10, 5000), limit=st.integers(-1, 4096))
def test_max_new_tokens_range(value: int, limit: int) -> None:
    upper = limit if limit > 0 else 32768
    if 2 <= value <= upper:
        check_max_new_tokens(value, limit)
    else:
        with pytest.raises(InvalidRequestError, match=rf"must be in \[2, {upper}\]"):
            check_max_new_tokens(value, limit)


def _info(model_type: str, **defaults) -> tts_pb2.ModelInfo:
    talker = stages_pb2.TalkerInfo(
        model=tts_pb2.ModelInfo(
            model_type=model_type,
            model_size="0b6",
            languages=["auto", "english"],
            speakers=[tts_pb2.PresetSpeaker(name="ryan")] if model_type == "custom_voice" else [],
            voice_clone_supported=model_type == "base",
            instruct_supported=model_type == "voice_design",
            default_sampling=tts_pb2.SamplingOptions(**defaults),
        ),
        max_seq_len=512,
    )
    return effective_model_info(talker)


def test_plan_resolves_every_default() -> None:
    info = _info("voice_design", temperature=0.5, max_new_tokens=8192)
    assert info.max_new_tokens_limit == 512 and info.default_sampling.max_new_tokens == 512
    plan = plan_synthesis(tts_pb2.SynthesizeRequest(text="Hi.", language="English"), info, RequestLimits())
    assert plan.language == "english" and plan.text_feeding == tts_pb2.TEXT_FEEDING_NON_STREAMING
    assert plan.sampling.temperature == 0.5 and plan.sampling.seed is not None and plan.max_new_tokens is None
    again = plan_synthesis(
        tts_pb2.SynthesizeRequest(text="Hi.", sampling=tts_pb2.SamplingOptions(seed=9, max_new_tokens=40)),
        info,
        RequestLimits(),
    )
    assert again.sampling.seed == 9 and again.max_new_tokens == 40
    message = talker_request(again, "rid")
    assert message.sampling.seed == 9 and message.sampling.max_new_tokens == 40
    assert not talker_request(plan, "rid").sampling.HasField("max_new_tokens")  # the talker's guard applies
    clone = tts_pb2.VoiceClone(ref_audio=b"x", x_vector_only=True)
    base = plan_synthesis(tts_pb2.SynthesizeRequest(text="Hi.", clone=clone), _info("base"), RequestLimits())
    assert base.text_feeding == tts_pb2.TEXT_FEEDING_STREAMING  # the official per-type default


@pytest.mark.parametrize(
    "request_fields, match",
    [
        ({"text": " "}, "text is empty"),
        ({"text": "x" * 11}, "text is too long: 11 characters \\(maximum 10\\)"),
        ({"text": "hi", "language": "klingon"}, "unknown language 'klingon' for the voice_design 0b6 model"),
        ({"text": "hi", "speaker": "ryan"}, "preset speakers need a custom_voice model"),
        ({"text": "hi", "text_feeding": 7}, "unknown text_feeding 7"),
        ({"text": "hi", "sampling": tts_pb2.SamplingOptions(max_new_tokens=513)}, r"\[2, 512\]"),
    ],
)
def test_plan_messages(request_fields: dict, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        plan_synthesis(
            tts_pb2.SynthesizeRequest(**request_fields),
            _info("voice_design"),
            RequestLimits(max_text_chars=10),
        )
