"""Gateway request validation: every bad input gets the right status code and a message naming
the problem (checked end to end through the gRPC server), plus the pure resolution helpers."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.helpers.fake_stages import Harness, expect_rpc_error, model_info, run
from tts_common.audio import encode_audio_file
from tts_common.chunking import resolve_chunking
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis import MAX_NEW_TOKENS_CAP
from tts_common.synthesis.validation import default_sampling, effective_model_info, plan_sampling

S = tts_pb2.SamplingOptions
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def wav_bytes(seconds: float = 1.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return encode_audio_file((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, "wav")


def cv(**kwargs: object) -> tts_pb2.SynthesizeRequest:
    """A valid custom_voice request with ``kwargs`` replaced."""
    base: dict[str, object] = {"text": "Hello.", "speaker": "vivian"}
    base.update(kwargs)
    return tts_pb2.SynthesizeRequest(**base)  # type: ignore[arg-type]


def clone(**kwargs: object) -> tts_pb2.SynthesizeRequest:
    """A base-model request with an inline clone built from ``kwargs``."""
    fields: dict[str, object] = {"ref_audio": wav_bytes(), "ref_text": "Reference words."}
    fields.update(kwargs)
    voice = tts_pb2.VoiceClone(**fields)  # type: ignore[arg-type]
    return tts_pb2.SynthesizeRequest(text="Hello.", clone=voice)


def fmt(encoding: int = 0, rate: int = 0) -> tts_pb2.AudioFormat:
    return tts_pb2.AudioFormat(encoding=encoding, sample_rate=rate)  # type: ignore[arg-type]


def stream(first: int = 0, largest: int = 0) -> tts_pb2.StreamingOptions:
    return tts_pb2.StreamingOptions(first_chunk_frames=first, max_chunk_frames=largest)


CUSTOM_VOICE_CASES: list[tuple[str, tts_pb2.SynthesizeRequest, grpc.StatusCode, str]] = [
    ("empty text", cv(text=""), INVALID, "text is empty"),
    ("whitespace text", cv(text="  \n\t "), INVALID, "text is empty"),
    ("text too long", cv(text="a" * 301), INVALID, "text is too long: 301 characters"),
    ("unknown language", cv(language="Klingon"), INVALID, "unknown language 'Klingon'"),
    ("unknown speaker", cv(speaker="nobody"), INVALID, "unknown speaker 'nobody'"),
    ("no speaker", tts_pb2.SynthesizeRequest(text="Hi"), INVALID, "speaker is required"),
    (
        "voice_id on custom_voice",
        tts_pb2.SynthesizeRequest(text="Hi", voice_id="voice-x"),
        INVALID,
        "voice cloning (voice_id) needs a base model",
    ),
    (
        "clone on custom_voice",
        tts_pb2.SynthesizeRequest(text="Hi", clone=tts_pb2.VoiceClone(ref_audio=b"x")),
        INVALID,
        "voice cloning (clone) needs a base model",
    ),
    ("instruct unsupported", cv(instruct="whisper"), INVALID, "instruct is not supported"),
    ("temperature 0", cv(sampling=S(temperature=0)), INVALID, "sampling.temperature must be > 0"),
    ("temperature < 0", cv(sampling=S(temperature=-1)), INVALID, "sampling.temperature"),
    ("temperature nan", cv(sampling=S(temperature=float("nan"))), INVALID, "sampling.temperature"),
    (
        "subtalker temperature 0",
        cv(sampling=S(subtalker_temperature=0)),
        INVALID,
        "sampling.subtalker_temperature",
    ),
    ("top_p 0", cv(sampling=S(top_p=0)), INVALID, "sampling.top_p must be in (0, 1]"),
    ("top_p > 1", cv(sampling=S(top_p=1.5)), INVALID, "sampling.top_p"),
    ("subtalker top_p > 1", cv(sampling=S(subtalker_top_p=2)), INVALID, "sampling.subtalker_top_p"),
    ("top_k < 0", cv(sampling=S(top_k=-1)), INVALID, "sampling.top_k must be >= 0"),
    ("subtalker top_k < 0", cv(sampling=S(subtalker_top_k=-3)), INVALID, "sampling.subtalker_top_k"),
    (
        "repetition penalty 0",
        cv(sampling=S(repetition_penalty=0)),
        INVALID,
        "sampling.repetition_penalty must be > 0",
    ),
    (
        "max_new_tokens 1",
        cv(sampling=S(max_new_tokens=1)),
        INVALID,
        "sampling.max_new_tokens must be in [2, 4096]",
    ),  # the talker's slot length
    ("max_new_tokens huge", cv(sampling=S(max_new_tokens=10**7)), INVALID, "sampling.max_new_tokens"),
    ("unknown encoding", cv(output=fmt(encoding=42)), INVALID, "unknown output.encoding 42"),
    ("sample rate too low", cv(output=fmt(rate=7999)), INVALID, "output.sample_rate 7999 Hz"),
    ("sample rate too high", cv(output=fmt(rate=192001)), INVALID, "output.sample_rate"),
    ("negative sample rate", cv(output=fmt(rate=-16000)), INVALID, "output.sample_rate"),
    (
        "opus rate",
        cv(output=fmt(tts_pb2.AUDIO_ENCODING_OGG_OPUS, 44100)),
        INVALID,
        "OGG_OPUS supports sample rates",
    ),
    (
        "first chunk < 0",
        cv(streaming=stream(first=-1)),
        INVALID,
        "streaming.first_chunk_frames must be in [0, 100]",
    ),
    ("first chunk > 100", cv(streaming=stream(first=101)), INVALID, "streaming.first_chunk_frames"),
    ("max chunk > 100", cv(streaming=stream(largest=101)), INVALID, "streaming.max_chunk_frames"),
    (
        "max chunk < first",
        cv(streaming=stream(first=10, largest=5)),
        INVALID,
        "streaming.max_chunk_frames (5) must be >= streaming.first_chunk_frames (10)",
    ),
    ("unknown text feeding", cv(text_feeding=9), INVALID, "unknown text_feeding 9"),
    ("talker rejects", cv(text="talker-reject"), INVALID, "fake talker rejects this"),
]


def test_custom_voice_validation_errors() -> None:
    async def main() -> None:
        async with Harness("custom_voice", max_text_chars=300) as h:
            for name, req, code, message in CUSTOM_VOICE_CASES:
                err = await expect_rpc_error(h.stub.Synthesize(req))
                assert err.code() == code, (name, err.code(), err.details())
                assert message in err.details(), (name, err.details())
            assert len(h.talker.requests) == 1  # only "talker rejects" reached the talker
            # case-insensitive names and "auto" are fine
            for language in ("", "auto", "AUTO", "Chinese"):
                meta, _, _ = await h.synthesize(cv(speaker="RYAN", language=language))
                assert meta.language == (language.lower() or "auto")

    run(main())


BASE_CASES: list[tuple[str, tts_pb2.SynthesizeRequest, grpc.StatusCode, str]] = [
    ("speaker on base", cv(), INVALID, "preset speakers need a custom_voice model"),
    ("no voice", tts_pb2.SynthesizeRequest(text="Hi"), INVALID, "a voice is required"),
    (
        "unknown voice_id",
        tts_pb2.SynthesizeRequest(text="Hi", voice_id="voice-nope"),
        grpc.StatusCode.NOT_FOUND,
        "unknown voice_id 'voice-nope'",
    ),
    (
        "ref_text with x_vector_only",
        clone(x_vector_only=True),
        INVALID,
        "clone.ref_text must be empty with x_vector_only",
    ),
    ("missing ref_text", clone(ref_text=""), INVALID, "clone.ref_text (the transcript"),
    ("empty ref audio", clone(ref_audio=b""), INVALID, "clone.ref_audio is empty"),
    (
        "undecodable ref audio",
        clone(ref_audio=b"not audio at all"),
        INVALID,
        "clone.ref_audio: could not decode audio file",
    ),
    ("ref audio too long", clone(ref_audio=wav_bytes(3.5, 8000)), INVALID, "clone.ref_audio: audio too long"),
    (
        "ref audio too large",
        clone(ref_audio=b"\0" * 70000),
        INVALID,
        "clone.ref_audio is too large: 70000 bytes (maximum 65536)",
    ),
    (
        "raw without rate",
        clone(ref_audio=b"\0\0" * 4000, ref_audio_encoding=tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16),
        INVALID,
        "sample_rate is required",
    ),
    (
        "raw bad rate",
        clone(
            ref_audio=b"\0\0" * 4000,
            ref_audio_sample_rate=1000,
            ref_audio_encoding=tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16,
        ),
        INVALID,
        "unsupported sample rate 1000",
    ),
    ("unknown ref encoding", clone(ref_audio_encoding=17), INVALID, "unknown clone.ref_audio_encoding 17"),
    (
        "speaker stage rejects",
        clone(ref_audio=wav_bytes() + b"speaker-reject"),
        INVALID,
        "speaker stage: fake speaker rejects this",
    ),
]


def test_base_model_validation_errors() -> None:
    async def main() -> None:
        async with Harness("base", max_ref_audio_seconds=3.0, max_ref_audio_bytes=65536) as h:
            for name, req, code, message in BASE_CASES:
                err = await expect_rpc_error(h.stub.Synthesize(req))
                assert err.code() == code, (name, err.code(), err.details())
                assert message in err.details(), (name, err.details())
            assert not h.talker.requests  # nothing reached the talker
            assert len(h.speaker.requests) == 1  # only "speaker stage rejects"

    run(main())


def test_voice_design_takes_optional_instruct_and_no_voice() -> None:
    async def main() -> None:
        async with Harness("voice_design") as h:
            await h.synthesize(tts_pb2.SynthesizeRequest(text="Hi"))  # no instruct, as the official allows
            assert h.talker.requests[-1].instruct == ""
            err = await expect_rpc_error(h.stub.Synthesize(cv(instruct="warm voice")))
            assert err.code() == INVALID and "preset speakers need a custom_voice" in err.details()
            meta, chunks, _ = await h.synthesize(
                tts_pb2.SynthesizeRequest(text="Hi", instruct="A warm, low voice.")
            )
            assert h.talker.requests[-1].instruct == "A warm, low voice."
            assert meta.text_feeding == tts_pb2.TEXT_FEEDING_NON_STREAMING and chunks

    run(main())


def test_clone_without_speaker_stage_is_failed_precondition() -> None:
    async def main() -> None:
        async with Harness("base", speaker=False) as h:
            err = await expect_rpc_error(h.stub.Synthesize(clone()))
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "speaker stage" in err.details() and "--speaker-targets" in err.details()
            err = await expect_rpc_error(
                h.stub.RegisterVoice(
                    tts_pb2.RegisterVoiceRequest(
                        reference=tts_pb2.VoiceClone(ref_audio=wav_bytes(), ref_text="Words.")
                    )
                )
            )
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            info = await h.stub.ListVoices(tts_pb2.ListVoicesRequest())
            assert not info.voice_clone_supported

    run(main())


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_plan_sampling_fills_every_field_and_draws_a_seed() -> None:
    info = model_info("custom_voice").model
    resolved, budget = plan_sampling(S(top_k=0, do_sample=False), info)
    assert resolved.top_k == 0 and resolved.do_sample is False
    assert resolved.temperature == pytest.approx(0.9)
    assert budget is None  # left to the talker's length guard
    assert plan_sampling(S(max_new_tokens=100), info)[1] == 100
    assert resolved.seed is not None and 0 <= resolved.seed < 2**31
    assert plan_sampling(S(seed=2**64 - 1), info)[0].seed == 2**64 - 1
    seeds = {plan_sampling(S(), info)[0].seed for _ in range(5)}
    assert len(seeds) > 1
    # a talker limit bounds explicit values
    info.max_new_tokens_limit = 1000
    with pytest.raises(InvalidRequestError, match=r"\[2, 1000\]"):
        plan_sampling(S(max_new_tokens=1001), info)
    # fields missing from the talker's defaults fall back to the built-in ones
    info.default_sampling.ClearField("top_k")
    assert default_sampling(info).top_k == 50
    # the limit the gateway applies: the talker's, else its slot length, else a fixed cap
    talker = model_info("custom_voice")
    assert effective_model_info(talker).max_new_tokens_limit == 4096
    talker.max_seq_len = 0
    assert effective_model_info(talker).max_new_tokens_limit == MAX_NEW_TOKENS_CAP
    talker.model.max_new_tokens_limit = 500
    assert effective_model_info(talker).default_sampling.max_new_tokens == 500


def test_resolve_chunking_defaults() -> None:
    def resolve(first: int, largest: int) -> tuple[int, int]:
        return resolve_chunking(first, largest, default_first=2, default_max=25)

    assert resolve(0, 0) == (2, 25)
    assert resolve(5, 0) == (5, 25)
    assert resolve(30, 0) == (30, 30)  # explicit first above the default max moves the max
    assert resolve(0, 1) == (1, 1)  # explicit max below the default first moves the first
    assert resolve(100, 100) == (100, 100)
