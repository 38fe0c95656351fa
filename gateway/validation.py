"""What the gateway checks beyond the shared synthesis validator (``tts_common.synthesis``): the
output format and chunking of a Synthesize request, and RegisterVoice requests.

Every check raises :class:`~tts_common.errors.InvalidRequestError` (INVALID_ARGUMENT) with a
message naming the field, the offending value and what is accepted.
"""

from __future__ import annotations

from tts_common.chunking import resolve_chunking
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import (
    RequestLimits,
    SynthesisPlan,
    check_clone,
    check_voice_kind,
    native_sample_rate,
    plan_synthesis,
)

from .audio_stream import OutputPlan
from .encoding import check_output_format, default_sample_rate

MAX_VOICE_NAME_CHARS = 200


def plan_output(
    request: tts_pb2.SynthesizeRequest, info: tts_pb2.ModelInfo, default_first: int, default_max: int
) -> OutputPlan:
    """Encoding (UNSPECIFIED -> PCM16), sample rate (0 -> native, 8000 Hz for the G.711 encodings)
    and chunk sizes (0 -> the server's defaults) of a request."""
    encoding = request.output.encoding or tts_pb2.AUDIO_ENCODING_PCM16
    sample_rate = request.output.sample_rate or default_sample_rate(encoding, native_sample_rate(info))
    check_output_format(encoding, sample_rate)
    first, largest = resolve_chunking(
        request.streaming.first_chunk_frames,
        request.streaming.max_chunk_frames,
        default_first=default_first,
        default_max=default_max,
    )
    return OutputPlan(
        encoding=encoding, sample_rate=sample_rate, first_chunk_frames=first, max_chunk_frames=largest
    )


def validate_synthesize(
    request: tts_pb2.SynthesizeRequest,
    info: tts_pb2.ModelInfo,
    limits: RequestLimits,
    default_first_chunk_frames: int,
    default_max_chunk_frames: int,
    *,
    streamed_text: bool = False,
) -> tuple[SynthesisPlan, OutputPlan]:
    """The synthesis plan (shared validator) and the output plan of a Synthesize request, or with
    ``streamed_text`` of a StreamingSynthesize configuration (see ``plan_synthesis``)."""
    plan = plan_synthesis(request, info, limits, streamed_text=streamed_text)
    return plan, plan_output(request, info, default_first_chunk_frames, default_max_chunk_frames)


def validate_register(
    request: tts_pb2.RegisterVoiceRequest, info: tts_pb2.ModelInfo, limits: RequestLimits
) -> None:
    """Checks of a RegisterVoice request (base models only; the reference like ``clone``)."""
    check_voice_kind("clone", info)
    if len(request.name) > MAX_VOICE_NAME_CHARS:
        raise InvalidRequestError(
            f"name is too long: {len(request.name)} characters (maximum {MAX_VOICE_NAME_CHARS})"
        )
    if not request.HasField("reference"):
        raise InvalidRequestError("reference (reference audio and transcript) is required")
    check_clone(request.reference, limits, "reference")
