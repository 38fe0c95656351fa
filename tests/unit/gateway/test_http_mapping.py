"""The HTTP API's pure parts, pinned with properties: an OpenAI body mapped onto a
``SynthesizeRequest`` field for field, voice resolution (aliases, case, registered ids), the alias
flag, and exceptions to HTTP statuses and OpenAI error objects (a retry hint included)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import parse_voice_aliases
from gateway.stages.pipeline import StageError
from gateway.transports.http.errors import HTTP_STATUS, http_error, internal_message
from gateway.transports.http.formats import RESPONSE_FORMATS
from gateway.transports.http.schemas import SAMPLING_FIELDS, TEXT_FEEDINGS, SpeechRequest
from gateway.transports.http.speech import resolve_voice, synthesize_request
from gateway.voice_library import VoiceStoreUnavailableError
from tts_common import errors
from tts_common.pb.qwen3tts.v1 import tts_pb2

SPEAKERS = ("vivian", "ryan", "eric")
VOICE_ID = "voice-" + "0a" * 16
"""The form of a registered voice's id (whether one exists is the library's to say, later)."""


def info(model_type: str = "custom_voice") -> tts_pb2.ModelInfo:
    speakers = [tts_pb2.PresetSpeaker(name=n) for n in SPEAKERS] if model_type == "custom_voice" else []
    return tts_pb2.ModelInfo(model_type=model_type, speakers=speakers)


def _sampling_value(field: FieldDescriptor) -> st.SearchStrategy[object]:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(-1e6, 1e6, allow_nan=False)
    if field.type == FieldDescriptor.TYPE_UINT64:
        return st.integers(0, 2**64 - 1)
    return st.integers(-(2**31), 2**31 - 1)


SAMPLING = st.fixed_dictionaries(
    {},
    optional={f.name: _sampling_value(f) for f in tts_pb2.SamplingOptions.DESCRIPTOR.fields},
)


@settings(max_examples=150, deadline=None)
@given(
    sampling=SAMPLING,
    fmt=st.sampled_from(sorted(RESPONSE_FORMATS)),
    feeding=st.sampled_from(sorted(TEXT_FEEDINGS)),
    text=st.text(max_size=40),
    language=st.text(max_size=10),
    instructions=st.text(max_size=20),
    rate=st.integers(0, 192000),
    first=st.integers(0, 100),
    largest=st.integers(0, 100),
    speaker=st.sampled_from(SPEAKERS),
)
def test_body_maps_field_for_field(
    sampling: dict[str, object],
    fmt: str,
    feeding: str,
    text: str,
    language: str,
    instructions: str,
    rate: int,
    first: int,
    largest: int,
    speaker: str,
) -> None:
    body = SpeechRequest(
        model="any",
        input=text,
        voice=speaker.upper(),
        instructions=instructions,
        response_format=fmt,
        language=language,
        text_feeding=feeding,
        sample_rate=rate,
        first_chunk_frames=first,
        max_chunk_frames=largest,
        **sampling,
    )
    request = synthesize_request(body, "rid", info(), {})
    assert (request.request_id, request.text, request.language, request.instruct) == (
        "rid",
        text,
        language,
        instructions,
    )
    assert request.WhichOneof("voice") == "speaker" and request.speaker == speaker
    assert request.text_feeding == TEXT_FEEDINGS[feeding]
    assert request.output.encoding == RESPONSE_FORMATS[fmt].encoding and request.output.sample_rate == rate
    assert (request.streaming.first_chunk_frames, request.streaming.max_chunk_frames) == (first, largest)
    for name in SAMPLING_FIELDS:  # set exactly the fields the body set, to the same values
        assert request.sampling.HasField(name) == (name in sampling), name
        if name in sampling:
            assert getattr(request.sampling, name) == sampling[name], name


def test_unknown_and_mistyped_fields_are_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="temprature"):
        SpeechRequest(model="m", input="x", voice="v", temprature=1.0)
    with pytest.raises(ValidationError, match="seed"):
        SpeechRequest(model="m", input="x", voice="v", seed=-1)
    with pytest.raises(ValidationError, match="response_format"):
        SpeechRequest(model="m", input="x", voice="v", response_format="ogg")


NAMES = st.text(st.characters(categories=("Ll", "Lu", "Nd")), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    aliases=st.dictionaries(
        NAMES.map(str.lower), st.sampled_from([*SPEAKERS, VOICE_ID, "voice-a", "ghost"]), max_size=4
    ),
    name=st.one_of(NAMES, st.sampled_from([*SPEAKERS, VOICE_ID, "voice-a", "ghost", "ALLOY"])),
    model_type=st.sampled_from(["custom_voice", "base", "voice_design"]),
)
def test_voice_resolution(aliases: dict[str, str], name: str, model_type: str) -> None:
    """An alias (any case) stands for its target; then a preset speaker (any case), then
    anything of a registered id's form; voice_design ignores what names nothing; elsewhere it
    is NOT_FOUND."""
    model = info(model_type)
    target = aliases.get(name.lower(), name)
    try:
        resolved = resolve_voice(name, model, aliases)
    except errors.NotFoundError:
        resolved = None
    if model_type == "custom_voice" and target.lower() in SPEAKERS:
        assert resolved == {"speaker": target.lower()}
    elif target == VOICE_ID:
        assert resolved == {"voice_id": VOICE_ID}
    elif model_type == "voice_design":
        assert resolved == {}
    else:
        assert resolved is None


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(NAMES, NAMES, max_size=5))
def test_voice_alias_flag(pairs: dict[str, str]) -> None:
    lowered = {k.lower(): v for k, v in pairs.items()}
    if len(lowered) != len(pairs):  # two aliases equal but for case
        with pytest.raises(argparse.ArgumentTypeError, match="given twice"):
            parse_voice_aliases(",".join(f"{k}={v}" for k, v in pairs.items()))
        return
    text = " , ".join(f" {k} = {v} " for k, v in pairs.items())
    assert dict(parse_voice_aliases(text)) == lowered
    for bad in ("alloy", "=x", "alloy="):
        with pytest.raises(argparse.ArgumentTypeError, match="ALIAS=VOICE"):
            parse_voice_aliases(bad)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (errors.InvalidRequestError("bad"), 400),
        (errors.FailedPreconditionError("no speaker stage"), 400),
        (errors.UnauthenticatedError("no key"), 401),
        (errors.PermissionDeniedError("bad key"), 403),
        (errors.NotFoundError("no voice"), 404),
        (errors.PayloadTooLargeError("too big"), 413),
        (errors.CapacityError("full"), 429),
        (errors.UnavailableError("draining"), 503),
        (TimeoutError(), 504),
        (RuntimeError("bug"), 500),
    ],
)
def test_project_errors_to_http(exc: BaseException, status: int) -> None:
    error = http_error(exc, "req-1")
    assert error.status == status
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert ("Retry-After" in error.headers) == (status in (429, 503))
    assert type(exc).__name__ not in error.message  # never the class name
    if status == 500:
        assert error.body()["error"]["type"] == "server_error"
        assert error.message == internal_message("req-1")
        assert "bug" not in error.message  # the log has it, not the client


@given(st.floats(0.001, 3600.0))
def test_a_retry_hint_becomes_retry_after(seconds: float) -> None:
    """An error that knows when to retry (the voice database down) says so in whole seconds,
    rounded up, at least 1; the others keep the default."""
    error = http_error(VoiceStoreUnavailableError("voice store unavailable", retry_after_s=seconds))
    assert error.status == 503 and error.grpc_code == grpc.StatusCode.UNAVAILABLE
    hint = int(error.headers["Retry-After"])
    assert hint >= 1 and hint - 1 < seconds <= hint
    assert error.body()["error"]["type"] == "service_unavailable_error"
    assert http_error(errors.UnavailableError("draining")).headers == {"Retry-After": "1"}


@given(st.sampled_from(list(grpc.StatusCode)))
def test_stage_errors_keep_their_status(code: grpc.StatusCode) -> None:
    """A stage failure is answered with the HTTP status of the gRPC status it carries (a
    connection-level one is UNAVAILABLE: 503), naming the stage."""
    error = http_error(StageError("talker", code, "details"))
    expected = StageError("talker", code, "").code
    assert error.status == HTTP_STATUS[expected] and error.grpc_code == expected
    assert error.body()["error"]["code"] == expected.name.lower()
    assert "talker stage" in error.message


@given(st.sampled_from([c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]))
def test_a_bare_stage_call_error_keeps_its_status_not_its_details(code: grpc.StatusCode) -> None:
    """A stage call's error no StageError wrapped: grpc-core's details (addresses) stay in the log."""
    details = "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:50051: refused"
    rpc_error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, details)
    error = http_error(rpc_error, "req-a")
    assert error.status == HTTP_STATUS[code] and error.grpc_code is code
    assert "10.0.0.5" not in error.message and "req-a" in error.message


@functools.cache
def _ttfb_bench() -> ModuleType:
    """bench/http_ttfb.py (a script, not a package)."""
    path = Path(__file__).parents[3] / "bench" / "http_ttfb.py"
    spec = importlib.util.spec_from_file_location("http_ttfb", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(sorted(RESPONSE_FORMATS)),
    voice=st.sampled_from(["", *SPEAKERS]),
    instructions=st.text(max_size=10),
    seed=st.integers(0, 2**63 - 1),
    max_new_tokens=st.integers(0, 4096),
)
def test_ttfb_bench_sends_the_same_request_both_ways(
    fmt: str, voice: str, instructions: str, seed: int, max_new_tokens: int
) -> None:
    """bench/http_ttfb.py compares transports on one request: its HTTP body, mapped by the
    gateway, is exactly its gRPC request."""
    request = _ttfb_bench().Request("Hello.", voice, instructions, seed, max_new_tokens, fmt)
    kwargs = request.http_kwargs()
    body = SpeechRequest(**{k: v for k, v in kwargs.items() if k != "extra_body"}, **kwargs["extra_body"])
    model = info("custom_voice" if voice else "voice_design")
    expected = request.grpc()
    expected.streaming.SetInParent()  # the HTTP mapping always sets it (empty: the defaults)
    assert synthesize_request(body, "", model, {}) == expected
