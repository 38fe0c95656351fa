"""Request validation and default resolution for the public API.

Every check raises :class:`~tts_common.errors.InvalidRequestError` (INVALID_ARGUMENT) with a
message naming the field, the offending value and what is accepted, so a client can fix the
request without reading server logs. Resolution turns a request into a :class:`SynthesisPlan`
where every default is explicit (language lower-cased, text feeding never DEFAULT, every
sampling field set including the seed, chunk sizes, output encoding and rate): the stages never
guess, and the plan is what SynthesisMetadata reports. One exception: ``max_new_tokens`` stays
unset unless the client sets it, so that the talker applies its text-length-based guard (see
:func:`resolve_sampling`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tts_common.audio import AudioError, AudioLimits, load_audio
from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

from .config import MAX_CHUNK_FRAMES_LIMIT
from .encoding import NATIVE_SAMPLE_RATE, check_output_format, default_sample_rate

ABSOLUTE_MAX_NEW_TOKENS = 32768
"""Cap on SamplingOptions.max_new_tokens when the talker reports neither a limit nor its slot
length (~43 min of audio)."""

BUILTIN_SAMPLING = tts_pb2.SamplingOptions(
    do_sample=True,
    temperature=0.9,
    top_k=50,
    top_p=1.0,
    repetition_penalty=1.05,
    subtalker_do_sample=True,
    subtalker_temperature=0.9,
    subtalker_top_k=50,
    subtalker_top_p=1.0,
    max_new_tokens=2048,
)
"""Used for fields the talker's ModelInfo.default_sampling leaves unset (official wrapper
defaults, ARCHITECTURE.md §7)."""

SAMPLING_FIELDS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "subtalker_do_sample",
    "subtalker_temperature",
    "subtalker_top_k",
    "subtalker_top_p",
    "max_new_tokens",
)

MAX_VOICE_NAME_CHARS = 200

VoiceKind = Literal["speaker", "voice_id", "clone", "none"]

_REF_ENCODINGS = {
    tts_pb2.REFERENCE_AUDIO_ENCODING_UNSPECIFIED: "file",
    tts_pb2.REFERENCE_AUDIO_ENCODING_FILE: "file",
    tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_FLOAT32: "float32",
    tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16: "pcm16",
}
_TEXT_FEEDINGS = (
    tts_pb2.TEXT_FEEDING_DEFAULT,
    tts_pb2.TEXT_FEEDING_NON_STREAMING,
    tts_pb2.TEXT_FEEDING_STREAMING,
)


@dataclass(frozen=True)
class RequestLimits:
    """Size limits and chunking defaults applied to requests (from GatewayConfig)."""

    max_text_chars: int = 2000
    max_ref_audio_seconds: float = 60.0
    max_ref_audio_bytes: int = 32 * 1024 * 1024
    default_first_chunk_frames: int = 2
    default_max_chunk_frames: int = 25


@dataclass(frozen=True)
class SynthesisPlan:
    """A validated Synthesize request with every default resolved."""

    text: str
    language: str
    voice_kind: VoiceKind
    speaker: str
    voice_id: str
    clone: tts_pb2.VoiceClone | None
    instruct: str
    text_feeding: int
    sampling: tts_pb2.SamplingOptions
    encoding: int
    sample_rate: int
    first_chunk_frames: int
    max_chunk_frames: int


def _fail(message: str) -> InvalidRequestError:
    return InvalidRequestError(message)


def _model_label(info: tts_pb2.ModelInfo) -> str:
    parts = [p for p in (info.model_type, info.model_size) if p]
    return " ".join(parts) or "unknown"


def check_text(text: str, limits: RequestLimits, field: str = "text") -> str:
    """Non-empty, not only whitespace, at most ``max_text_chars`` characters."""
    if not text.strip():
        raise _fail(f"{field} is empty")
    if len(text) > limits.max_text_chars:
        raise _fail(f"{field} is too long: {len(text)} characters (maximum {limits.max_text_chars})")
    return text


def resolve_language(language: str, info: tts_pb2.ModelInfo) -> str:
    """Lower-cased language; "" means "auto"; must be one the model lists."""
    name = language.strip().lower()
    if name in ("", "auto"):
        return "auto"
    available = [lang.lower() for lang in info.languages]
    if name not in available:
        raise _fail(
            f"unknown language {language!r} for the {_model_label(info)} model "
            f"(available: {', '.join(available) or 'auto'})"
        )
    return name


def _check_speaker(speaker: str, info: tts_pb2.ModelInfo) -> str:
    names = [s.name.lower() for s in info.speakers]
    name = speaker.strip().lower()
    if not name:
        raise _fail(f"speaker is empty (available: {', '.join(names)})")
    if name not in names:
        raise _fail(f"unknown speaker {speaker!r} (available: {', '.join(names) or 'none'})")
    return name


def check_voice_kind(kind: VoiceKind, info: tts_pb2.ModelInfo) -> None:
    """The voice oneof must match the model type: preset ``speaker`` needs custom_voice,
    ``voice_id``/``clone`` need base, voice_design takes none."""
    model_type = info.model_type
    speakers = ", ".join(s.name for s in info.speakers)
    label = _model_label(info)
    if kind == "speaker":
        if model_type == "custom_voice" or (not model_type and info.speakers):
            return
        hint = "use voice_id or clone" if info.voice_clone_supported else "describe the voice in instruct"
        raise _fail(f"preset speakers need a custom_voice model; this server runs a {label} model ({hint})")
    if kind in ("voice_id", "clone"):
        if info.voice_clone_supported or model_type == "base":
            return
        hint = f"use speaker, one of: {speakers}" if info.speakers else "describe the voice in instruct"
        raise _fail(f"voice cloning ({kind}) needs a base model; this server runs a {label} model ({hint})")
    # no voice given
    if model_type == "custom_voice" or (not model_type and info.speakers):
        raise _fail(f"speaker is required for custom_voice models (available: {speakers})")
    if model_type == "base":
        raise _fail(
            "a voice is required for base models: set voice_id (see RegisterVoice) or clone (reference audio)"
        )


def check_instruct(instruct: str, info: tts_pb2.ModelInfo, limits: RequestLimits) -> str:
    """Instruction text: only where the model honours it. Optional for voice_design too: the
    official implementation synthesises without one (fixture ``vd_no_instruct``)."""
    if not instruct.strip():
        return ""
    if not info.instruct_supported:
        raise _fail(
            f"instruct is not supported by the {_model_label(info)} model "
            "(ListVoices.instruct_supported is false)"
        )
    return check_text(instruct, limits, "instruct")


def check_clone(clone: tts_pb2.VoiceClone, limits: RequestLimits, field: str = "clone") -> None:
    """Cheap checks of inline reference audio (no decoding; see :func:`decode_reference`)."""
    if clone.ref_audio_encoding not in _REF_ENCODINGS:
        raise _fail(f"unknown {field}.ref_audio_encoding {clone.ref_audio_encoding}")
    if not clone.ref_audio:
        raise _fail(f"{field}.ref_audio is empty")
    if len(clone.ref_audio) > limits.max_ref_audio_bytes:
        raise _fail(
            f"{field}.ref_audio is too large: {len(clone.ref_audio)} bytes "
            f"(maximum {limits.max_ref_audio_bytes})"
        )
    if clone.x_vector_only:
        if clone.ref_text.strip():
            raise _fail(
                f"{field}.ref_text must be empty with x_vector_only (an x-vector-only "
                "clone uses no transcript)"
            )
    else:
        if not clone.ref_text.strip():
            raise _fail(
                f"{field}.ref_text (the transcript of ref_audio) is required unless x_vector_only is set"
            )
        check_text(clone.ref_text, limits, f"{field}.ref_text")


def decode_reference(clone: tts_pb2.VoiceClone, limits: RequestLimits, field: str = "clone") -> float:
    """Decode the reference audio as the speaker stage will (CPU work: run in a thread);
    returns its duration in seconds. INVALID_ARGUMENT for undecodable, empty, too long, bad
    rate, NaN audio."""
    encoding = _REF_ENCODINGS[clone.ref_audio_encoding]
    rate = None if encoding == "file" else (clone.ref_audio_sample_rate or None)
    try:
        samples = load_audio(
            clone.ref_audio,
            rate,
            encoding=encoding,  # type: ignore[arg-type]
            target_sample_rate=NATIVE_SAMPLE_RATE,
            limits=AudioLimits(max_seconds=limits.max_ref_audio_seconds),
        )
    except AudioError as exc:
        raise _fail(f"{field}.ref_audio: {exc}") from exc
    return samples.shape[0] / NATIVE_SAMPLE_RATE


def default_sampling(info: tts_pb2.ModelInfo) -> tts_pb2.SamplingOptions:
    """The model's sampling defaults with every field except the seed set."""
    out = tts_pb2.SamplingOptions()
    for name in SAMPLING_FIELDS:
        src = info.default_sampling if info.default_sampling.HasField(name) else BUILTIN_SAMPLING
        setattr(out, name, getattr(src, name))
    if info.max_new_tokens_limit > 0:
        out.max_new_tokens = min(out.max_new_tokens, info.max_new_tokens_limit)
    return out


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise _fail(f"sampling.{name} must be > 0, got {value}")


def _check_top_p(name: str, value: float) -> None:
    if not 0 < value <= 1:  # also false for NaN
        raise _fail(f"sampling.{name} must be in (0, 1], got {value}")


def _check_top_k(name: str, value: int) -> None:
    if value < 0:
        raise _fail(f"sampling.{name} must be >= 0 (0 disables top-k), got {value}")


_SAMPLING_CHECKS: tuple[tuple[str, Callable[[str, Any], None]], ...] = (
    ("temperature", _check_positive),
    ("subtalker_temperature", _check_positive),
    ("top_p", _check_top_p),
    ("subtalker_top_p", _check_top_p),
    ("top_k", _check_top_k),
    ("subtalker_top_k", _check_top_k),
    ("repetition_penalty", _check_positive),
)
"""Range checks of the client-set sampling fields (max_new_tokens is checked against the model)."""


def new_seed() -> int:
    """A random seed below 2**31 (fits every RNG API and JSON clients' numbers)."""
    return secrets.randbelow(2**31)


def resolve_sampling(options: tts_pb2.SamplingOptions, info: tts_pb2.ModelInfo) -> tts_pb2.SamplingOptions:
    """Client values (checked) over the model defaults: every field set, the seed drawn if the
    client gave none; ``max_new_tokens`` only if the client set it (see the comment below)."""
    for name, check in _SAMPLING_CHECKS:
        if options.HasField(name):
            check(name, getattr(options, name))
    if options.HasField("max_new_tokens"):
        limit = info.max_new_tokens_limit or ABSOLUTE_MAX_NEW_TOKENS
        if not 2 <= options.max_new_tokens <= limit:
            raise _fail(
                f"sampling.max_new_tokens must be in [2, {limit}] (M steps give at "
                f"most M-1 frames), got {options.max_new_tokens}"
            )
    resolved = default_sampling(info)
    resolved.MergeFrom(options)  # set fields of `options` win (proto3 optional presence)
    if not options.HasField("max_new_tokens"):
        # Left unset on purpose: the talker then applies its length guard (a frame budget from
        # the text length, capped to what fits in a KV slot), whereas an explicit value is
        # taken literally and rejected (RESOURCE_EXHAUSTED) when it cannot fit in a slot.
        resolved.ClearField("max_new_tokens")
    if not resolved.HasField("seed"):
        resolved.seed = new_seed()
    return resolved


def effective_model_info(talker: stages_pb2.TalkerInfo) -> tts_pb2.ModelInfo:
    """The talker's ModelInfo as the gateway applies it: ``max_new_tokens_limit`` filled in
    (the talker's, else its slot length ``max_seq_len``, else :data:`ABSOLUTE_MAX_NEW_TOKENS`),
    ``default_sampling`` complete, ``sample_rate`` set."""
    info = tts_pb2.ModelInfo()
    info.CopyFrom(talker.model)
    if info.max_new_tokens_limit <= 0:
        info.max_new_tokens_limit = talker.max_seq_len or ABSOLUTE_MAX_NEW_TOKENS
    info.default_sampling.CopyFrom(default_sampling(info))
    if not info.sample_rate:
        info.sample_rate = NATIVE_SAMPLE_RATE
    return info


def resolve_output(output: tts_pb2.AudioFormat, info: tts_pb2.ModelInfo) -> tuple[int, int]:
    """(encoding, sample_rate) with UNSPECIFIED -> PCM16 and 0 -> the native rate (8000 Hz for
    the G.711 encodings)."""
    encoding = output.encoding or tts_pb2.AUDIO_ENCODING_PCM16
    sample_rate = output.sample_rate or default_sample_rate(encoding, info.sample_rate or NATIVE_SAMPLE_RATE)
    check_output_format(encoding, sample_rate)
    return encoding, sample_rate


def resolve_streaming(streaming: tts_pb2.StreamingOptions, limits: RequestLimits) -> tuple[int, int]:
    """(first_chunk_frames, max_chunk_frames) with 0 -> the defaults; a single explicit value
    that contradicts the other default moves that default along."""
    for name in ("first_chunk_frames", "max_chunk_frames"):
        value = getattr(streaming, name)
        if not 0 <= value <= MAX_CHUNK_FRAMES_LIMIT:
            raise _fail(
                f"streaming.{name} must be in [0, {MAX_CHUNK_FRAMES_LIMIT}] (0 = server default), got {value}"
            )
    first = streaming.first_chunk_frames or limits.default_first_chunk_frames
    largest = streaming.max_chunk_frames or limits.default_max_chunk_frames
    if largest < first:
        if streaming.first_chunk_frames and streaming.max_chunk_frames:
            raise _fail(
                f"streaming.max_chunk_frames ({largest}) must be >= streaming.first_chunk_frames ({first})"
            )
        if streaming.max_chunk_frames:
            first = largest
        else:
            largest = first
    return first, largest


def validate_synthesize(
    request: tts_pb2.SynthesizeRequest, info: tts_pb2.ModelInfo, limits: RequestLimits
) -> SynthesisPlan:
    """Check a Synthesize request against the loaded model and resolve its defaults (without
    decoding reference audio: see :func:`decode_reference`)."""
    text = check_text(request.text, limits)
    language = resolve_language(request.language, info)
    kind: VoiceKind = request.WhichOneof("voice") or "none"  # type: ignore[assignment]
    check_voice_kind(kind, info)
    speaker = _check_speaker(request.speaker, info) if kind == "speaker" else ""
    if kind == "voice_id" and not request.voice_id.strip():
        raise _fail("voice_id is empty")
    clone = request.clone if kind == "clone" else None
    if clone is not None:
        check_clone(clone, limits)
    instruct = check_instruct(request.instruct, info, limits)
    if request.text_feeding not in _TEXT_FEEDINGS:
        raise _fail(f"unknown text_feeding {request.text_feeding}")
    text_feeding = request.text_feeding
    if text_feeding == tts_pb2.TEXT_FEEDING_DEFAULT:  # the official API's per-kind default
        text_feeding = (
            tts_pb2.TEXT_FEEDING_STREAMING
            if kind in ("voice_id", "clone")
            else tts_pb2.TEXT_FEEDING_NON_STREAMING
        )
    sampling = resolve_sampling(request.sampling, info)
    encoding, sample_rate = resolve_output(request.output, info)
    first, largest = resolve_streaming(request.streaming, limits)
    return SynthesisPlan(
        text=text,
        language=language,
        voice_kind=kind,
        speaker=speaker,
        voice_id=request.voice_id.strip() if kind == "voice_id" else "",
        clone=clone,
        instruct=instruct,
        text_feeding=text_feeding,
        sampling=sampling,
        encoding=encoding,
        sample_rate=sample_rate,
        first_chunk_frames=first,
        max_chunk_frames=largest,
    )


def validate_register(
    request: tts_pb2.RegisterVoiceRequest, info: tts_pb2.ModelInfo, limits: RequestLimits
) -> None:
    """Checks of a RegisterVoice request (base models only; reference like ``clone``)."""
    check_voice_kind("clone", info)
    if len(request.name) > MAX_VOICE_NAME_CHARS:
        raise _fail(f"name is too long: {len(request.name)} characters (maximum {MAX_VOICE_NAME_CHARS})")
    if not request.HasField("reference"):
        raise _fail("reference (reference audio and transcript) is required")
    check_clone(request.reference, limits, "reference")


__all__ = [
    "ABSOLUTE_MAX_NEW_TOKENS",
    "BUILTIN_SAMPLING",
    "RequestLimits",
    "SynthesisPlan",
    "check_clone",
    "check_instruct",
    "check_text",
    "check_voice_kind",
    "decode_reference",
    "default_sampling",
    "effective_model_info",
    "new_seed",
    "resolve_language",
    "resolve_output",
    "resolve_sampling",
    "resolve_streaming",
    "validate_register",
    "validate_synthesize",
]
