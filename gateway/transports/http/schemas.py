"""Request bodies of the HTTP API (pydantic): OpenAI's ``POST /v1/audio/speech`` body plus our own
fields (what the ``openai`` SDK sends as ``extra_body``).

Our fields keep the spelling of the gRPC ``SynthesizeRequest`` (one spelling per field): the
sampling fields are generated from ``SamplingOptions`` itself, so a new sampling field is accepted
here without a second list. Types and ranges a JSON value can violate are checked here; everything
else (what the served model accepts, value ranges, limits) by the shared validator
(:func:`tts_common.synthesis.validation.plan_synthesis`) once the body is mapped onto a
``SynthesizeRequest`` (:mod:`.speech`).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from google.protobuf.descriptor import FieldDescriptor
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..text import text_problem
from .formats import FormatName, StreamFormat

TextFeedingName = Literal["default", "non_streaming", "streaming"]
TEXT_FEEDINGS: dict[str, int] = {
    "default": tts_pb2.TEXT_FEEDING_DEFAULT,
    "non_streaming": tts_pb2.TEXT_FEEDING_NON_STREAMING,
    "streaming": tts_pb2.TEXT_FEEDING_STREAMING,
}


TimestampsName = Literal["none", "word", "character"]
TIMESTAMP_UNITS: dict[str, int] = {
    "none": tts_pb2.TIMESTAMP_UNIT_UNSPECIFIED,
    "word": tts_pb2.TIMESTAMP_UNIT_WORD,
    "character": tts_pb2.TIMESTAMP_UNIT_CHARACTER,
}


class ApiBody(BaseModel):
    """Base of every JSON body and message of the HTTP API: each field's text is checked
    (:func:`~gateway.transports.text.text_problem`: a lone surrogate is 400 naming the field,
    before any of it reaches a protobuf message or the voice database)."""

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        problem = text_problem(value)
        if problem is not None:
            raise PydanticCustomError("invalid_text", problem)
        return value


class VoiceRef(ApiBody):
    """OpenAI's custom-voice form of ``voice``: ``{"id": "voice-..."}``."""

    model_config = ConfigDict(extra="forbid")
    id: str


class _SpeechRequestBase(ApiBody):
    """OpenAI's body and the fields mirroring ``SynthesizeRequest`` (sampling fields are added
    by :data:`SpeechRequest`)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "",
        description="A served model (GET /v1/models) or an alias of one; absent or empty: the default model. "
        "Unknown: 404 listing the served models.",
    )
    input: str = Field(description="The text to speak.")
    voice: str | VoiceRef = Field(
        description="A preset speaker, a registered voice id, or an alias (--voice-alias); "
        "ignored by voice_design models (describe the voice in `instructions`)."
    )
    instructions: str = Field("", description="Style/voice instruction (SynthesizeRequest.instruct).")
    response_format: FormatName = "mp3"
    speed: float = Field(1.0, description="Time-scale factor in [0.25, 4.0]; 1.0 = unchanged.")
    stream_format: StreamFormat = "audio"
    # Our fields (the SDK's extra_body), spelt as in SynthesizeRequest.
    request_id: str = ""
    language: str = ""
    text_feeding: TextFeedingName = "default"
    sample_rate: int = Field(0, ge=0, le=2**31 - 1, description="Output rate; 0 = the format's default.")
    first_chunk_frames: int = Field(0, ge=0, le=2**31 - 1)
    max_chunk_frames: int = Field(0, ge=0, le=2**31 - 1)
    timestamps: TimestampsName = Field(
        "none",
        description="Word (or character) timings of the audio (SynthesizeRequest.timestamps): "
        "`speech.audio.timestamps` events (SSE, WebSocket), or in the body with stream_format `json`. "
        "Needs stream_format `sse` or `json` (a plain audio body has no place for them: else 400 naming "
        "both fields) and the gateway's aligner stage (else 400, FAILED_PRECONDITION).",
    )


TIMED_STREAM_FORMATS = ("sse", "json")
"""The ``stream_format`` values whose answer carries the timings."""


def check_speech_body(body: _SpeechRequestBase) -> None:
    """What one field of a ``POST /v1/audio/speech`` body requires of another (checked before
    the request is admitted): ``timestamps`` need a ``stream_format`` that carries them (a
    plain audio body would align every segment and throw the result away). 400 naming both
    fields (``param``: ``timestamps``). Not for the WebSocket's config, whose messages carry
    the timings whatever its ``stream_format``."""
    if body.timestamps != "none" and body.stream_format not in TIMED_STREAM_FORMATS:
        formats = " or ".join(f'"{name}"' for name in TIMED_STREAM_FORMATS)
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "timestamps"),
                    "msg": f'"{body.timestamps}" needs stream_format {formats} (stream_format '
                    f'"{body.stream_format}" is the audio alone, with no place for the timings)',
                    "type": "value_error",
                }
            ]
        )


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _sampling_fields() -> dict[str, Any]:
    """One optional body field per ``SamplingOptions`` field, typed after the proto."""
    fields: dict[str, Any] = {}
    for proto_field in tts_pb2.SamplingOptions.DESCRIPTOR.fields:
        kind = proto_field.type
        if kind == FieldDescriptor.TYPE_BOOL:
            fields[proto_field.name] = (bool | None, None)
        elif kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            fields[proto_field.name] = (float | None, None)
        elif kind in _INT_RANGES:
            low, high = _INT_RANGES[kind]
            fields[proto_field.name] = (int | None, Field(None, ge=low, le=high))
        else:  # a new kind of sampling field needs a decision here, not a silent omission
            raise TypeError(f"SamplingOptions.{proto_field.name}: unsupported proto type {kind}")
    return fields


SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in tts_pb2.SamplingOptions.DESCRIPTOR.fields)
"""The body fields that form ``SynthesizeRequest.sampling``."""

SpeechRequest: type[_SpeechRequestBase] = create_model(  # type: ignore[call-overload]
    "SpeechRequest",
    __base__=_SpeechRequestBase,
    __doc__="The body of POST /v1/audio/speech.",
    **_sampling_fields(),
)
"""The body of ``POST /v1/audio/speech`` (unknown fields are rejected, naming them)."""


__all__ = [
    "SAMPLING_FIELDS",
    "TIMED_STREAM_FORMATS",
    "TEXT_FEEDINGS",
    "TIMESTAMP_UNITS",
    "ApiBody",
    "SpeechRequest",
    "TextFeedingName",
    "TimestampsName",
    "VoiceRef",
    "check_speech_body",
]
