"""An OpenAI speech body mapped onto a ``SynthesizeRequest``, which the shared validator then
checks exactly as it checks a gRPC request.

``voice`` is resolved here (the one thing OpenAI's body spells differently from ours), for the
model the body names: an alias of the ``--voice-alias`` table first, then a preset speaker of the
model, then anything of a registered voice id's form (``voice-`` and 32 hex digits), looked up in
the voice library with the request, as for gRPC (the caller's own, of the model's family; so no
other voice waits for the database). A voice_design model has no named voices (the voice is
described in ``instructions``), so a ``voice`` that names none is ignored there; on the other
models it is NOT_FOUND (HTTP 404).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tts_common.errors import NotFoundError
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ...core import Gateway
from ...voice_library.records import VOICE_ID_PATTERN
from .formats import RESPONSE_FORMATS
from .schemas import SAMPLING_FIELDS, TEXT_FEEDINGS, TIMESTAMP_UNITS, VoiceRef


def voice_name(voice: str | VoiceRef) -> str:
    """The name in a ``voice`` field (a string, or OpenAI's ``{"id": ...}``)."""
    return (voice.id if isinstance(voice, VoiceRef) else voice).strip()


def resolve_voice(
    voice: str,
    info: tts_pb2.ModelInfo,
    aliases: Mapping[str, str],
) -> dict[str, str]:
    """The ``SynthesizeRequest`` voice fields for ``voice``: ``{"speaker": ...}``,
    ``{"voice_id": ...}``, or ``{}`` (voice_design models). NotFoundError if it names nothing."""
    target = aliases.get(voice.lower(), voice)
    speakers = {s.name.lower(): s.name for s in info.speakers}
    if target.lower() in speakers:
        return {"speaker": speakers[target.lower()]}
    if VOICE_ID_PATTERN.match(target):
        return {"voice_id": target}
    if info.model_type == "voice_design":
        return {}
    known = [f"preset speakers: {', '.join(speakers.values())}"] if speakers else []
    known.append("registered voice ids (GET /v1/audio/voices)")
    if aliases:
        known.append(f"aliases: {', '.join(sorted(aliases))}")
    raise NotFoundError(
        f"unknown voice {voice!r} for model {info.model_name!r} (expected {'; '.join(known)})"
    )


def synthesize_request(
    body: Any,
    request_id: str,
    info: tts_pb2.ModelInfo,
    aliases: Mapping[str, str],
) -> tts_pb2.SynthesizeRequest:
    """The ``SynthesizeRequest`` of a :data:`~.schemas.SpeechRequest` body for the model
    ``info`` describes (not yet validated: the core runs the shared validator on it)."""
    sampling = {name: getattr(body, name) for name in SAMPLING_FIELDS if getattr(body, name) is not None}
    return tts_pb2.SynthesizeRequest(
        request_id=request_id,
        model=info.model_name,
        text=body.input,
        language=body.language,
        instruct=body.instructions,
        text_feeding=TEXT_FEEDINGS[body.text_feeding],
        sampling=tts_pb2.SamplingOptions(**sampling),
        output=tts_pb2.AudioFormat(
            encoding=RESPONSE_FORMATS[body.response_format].encoding, sample_rate=body.sample_rate
        ),
        streaming=tts_pb2.StreamingOptions(
            first_chunk_frames=body.first_chunk_frames, max_chunk_frames=body.max_chunk_frames
        ),
        timestamps=TIMESTAMP_UNITS[body.timestamps],
        **resolve_voice(voice_name(body.voice), info, aliases),
    )


async def speech_request(
    body: Any, request_id: str, gateway: Gateway, aliases: Mapping[str, str]
) -> tts_pb2.SynthesizeRequest:
    """The ``SynthesizeRequest`` of a speech body (or a WebSocket configuration): its model
    (NOT_FOUND listing the served ones) and its ``voice`` resolved for that model."""
    info = await gateway.catalog.describe(gateway.models.get(body.model))
    return synthesize_request(body, request_id, info, aliases)


__all__ = ["resolve_voice", "speech_request", "synthesize_request", "voice_name"]
