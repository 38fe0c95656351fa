"""The one validator of synthesis requests: one message per mistake, wherever it is checked.

:func:`plan_synthesis` checks a public ``SynthesizeRequest`` against the served model (its
``ModelInfo``) and resolves every default into a :class:`SynthesisPlan`: language lower-cased,
text feeding never DEFAULT, every sampling field set including the seed. The gateway (gRPC and
HTTP) and the offline command plan with it. The talker trusts the plan's schema and re-checks only
what depends on its own checkpoint (:func:`check_talker_request`), with the same functions and
therefore the same messages. Every check raises :class:`~tts_common.errors.InvalidRequestError`
(INVALID_ARGUMENT) naming the field, the offending value and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from tts_common.audio import AudioError, AudioLimits, load_audio
from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

from .budget import MAX_NEW_TOKENS_CAP, check_max_new_tokens
from .sampling import BUILTIN_MAX_NEW_TOKENS, SamplingParams, new_seed, resolve_sampling, sampling_to_options

NATIVE_SAMPLE_RATE = 24000
"""The codec's output rate (every released 12 Hz checkpoint)."""


def native_sample_rate(info: tts_pb2.ModelInfo) -> int:
    """The served model's output rate: what its talker reports, else :data:`NATIVE_SAMPLE_RATE`."""
    return info.sample_rate or NATIVE_SAMPLE_RATE


VoiceKind = Literal["speaker", "voice_id", "clone", "none"]

REFERENCE_ENCODINGS: dict[int, Literal["file", "float32", "pcm16"]] = {
    tts_pb2.REFERENCE_AUDIO_ENCODING_UNSPECIFIED: "file",
    tts_pb2.REFERENCE_AUDIO_ENCODING_FILE: "file",
    tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_FLOAT32: "float32",
    tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_PCM16: "pcm16",
}
"""How reference audio bytes are read (``load_audio``'s encoding), by ``ReferenceAudioEncoding``."""

TEXT_FEEDINGS = (
    tts_pb2.TEXT_FEEDING_DEFAULT,
    tts_pb2.TEXT_FEEDING_NON_STREAMING,
    tts_pb2.TEXT_FEEDING_STREAMING,
)


@dataclass(frozen=True)
class RequestLimits:
    """Size limits of requests (server configuration)."""

    max_text_chars: int = 100_000
    """Longest ``text``, in characters (a long text is spoken as consecutive segments)."""
    max_instruct_chars: int = 2000
    """Longest ``instruct`` and ``ref_text``, in characters (part of every segment's prompt)."""
    max_ref_audio_seconds: float = 60.0
    """Longest reference recording (voice cloning)."""
    max_ref_audio_bytes: int = 32 * 1024 * 1024
    """Largest reference audio upload."""


@dataclass(frozen=True)
class SynthesisPlan:
    """A validated synthesis request with every default resolved."""

    text: str
    language: str
    """Lower-cased language name, or "auto"."""
    voice_kind: VoiceKind
    speaker: str
    """Lower-cased preset speaker ("" unless ``voice_kind == "speaker"``)."""
    voice_id: str
    clone: tts_pb2.VoiceClone | None
    instruct: str
    text_feeding: int
    """``TEXT_FEEDING_STREAMING`` or ``TEXT_FEEDING_NON_STREAMING``."""
    sampling: SamplingParams
    """Every field set, the seed included."""
    max_new_tokens: int | None
    """The client's value, or None: the talker then applies its runaway guard."""
    silence_stop: bool | None = None
    """The client's silence-stop switch, or None: the server's setting."""


def model_label(info: tts_pb2.ModelInfo) -> str:
    """``"custom_voice 0b6"``-style name of a model for messages."""
    parts = [p for p in (info.model_type, info.model_size) if p]
    return " ".join(parts) or "unknown"


def check_text(text: str, max_chars: int, field: str = "text") -> str:
    """Non-empty, not only whitespace, at most ``max_chars`` characters."""
    if not text.strip():
        raise InvalidRequestError(f"{field} is empty")
    if len(text) > max_chars:
        raise InvalidRequestError(f"{field} is too long: {len(text)} characters (maximum {max_chars})")
    return text


def resolve_language(language: str, info: tts_pb2.ModelInfo) -> str:
    """Lower-cased language; "" means "auto"; must be one the model lists."""
    name = language.strip().lower()
    if name in ("", "auto"):
        return "auto"
    available = [lang.lower() for lang in info.languages]
    if name not in available:
        raise InvalidRequestError(
            f"unknown language {language!r} for the {model_label(info)} model "
            f"(available: {', '.join(available) or 'auto'})"
        )
    return name


def check_speaker(speaker: str, info: tts_pb2.ModelInfo) -> str:
    """A preset speaker of the model, lower-cased."""
    names = [s.name.lower() for s in info.speakers]
    name = speaker.strip().lower()
    if not name:
        raise InvalidRequestError(f"speaker is empty (available: {', '.join(names)})")
    if name not in names:
        raise InvalidRequestError(f"unknown speaker {speaker!r} (available: {', '.join(names) or 'none'})")
    return name


def _is_custom_voice(info: tts_pb2.ModelInfo) -> bool:
    return info.model_type == "custom_voice" or (not info.model_type and bool(info.speakers))


def check_voice_kind(kind: VoiceKind, info: tts_pb2.ModelInfo) -> None:
    """The voice must match the model type: a preset ``speaker`` needs custom_voice,
    ``voice_id``/``clone`` need base, voice_design takes none."""
    speakers = ", ".join(s.name for s in info.speakers)
    label = model_label(info)
    serving = f"model {info.model_name!r} is" if info.model_name else "this server runs"
    if kind == "speaker":
        if _is_custom_voice(info):
            return
        hint = "use voice_id or clone" if info.voice_clone_supported else "describe the voice in instruct"
        raise InvalidRequestError(
            f"preset speakers need a custom_voice model; {serving} a {label} model ({hint})"
        )
    if kind in ("voice_id", "clone"):
        if info.voice_clone_supported or info.model_type == "base":
            return
        hint = f"use speaker, one of: {speakers}" if info.speakers else "describe the voice in instruct"
        raise InvalidRequestError(
            f"voice cloning ({kind}) needs a base model; {serving} a {label} model ({hint})"
        )
    if _is_custom_voice(info):
        raise InvalidRequestError(f"speaker is required for custom_voice models (available: {speakers})")
    if info.model_type == "base":
        raise InvalidRequestError(
            "a voice is required for base models: set voice_id (see RegisterVoice) or clone (reference audio)"
        )


def check_instruct(instruct: str, info: tts_pb2.ModelInfo, limits: RequestLimits) -> str:
    """Instruction text, only where the model honours it (optional for voice_design too: the
    official implementation synthesises without one)."""
    if not instruct.strip():
        return ""
    check_instruct_supported(info)
    return check_text(instruct, limits.max_instruct_chars, "instruct")


def check_instruct_supported(info: tts_pb2.ModelInfo) -> None:
    """INVALID_ARGUMENT unless the model honours ``instruct``."""
    if not info.instruct_supported:
        raise InvalidRequestError(
            f"instruct is not supported by the {model_label(info)} model "
            "(ListVoices.instruct_supported is false)"
        )


def check_clone(clone: tts_pb2.VoiceClone, limits: RequestLimits, field: str = "clone") -> None:
    """Cheap checks of inline reference audio (no decoding; see :func:`decode_reference`)."""
    if clone.ref_audio_encoding not in REFERENCE_ENCODINGS:
        raise InvalidRequestError(f"unknown {field}.ref_audio_encoding {clone.ref_audio_encoding}")
    if not clone.ref_audio:
        raise InvalidRequestError(f"{field}.ref_audio is empty")
    if len(clone.ref_audio) > limits.max_ref_audio_bytes:
        raise InvalidRequestError(
            f"{field}.ref_audio is too large: {len(clone.ref_audio)} bytes (maximum {limits.max_ref_audio_bytes})"
        )
    if clone.x_vector_only:
        if clone.ref_text.strip():
            raise InvalidRequestError(
                f"{field}.ref_text must be empty with x_vector_only (an x-vector-only clone uses no transcript)"
            )
    else:
        if not clone.ref_text.strip():
            raise InvalidRequestError(
                f"{field}.ref_text (the transcript of ref_audio) is required unless x_vector_only is set"
            )
        check_text(clone.ref_text, limits.max_instruct_chars, f"{field}.ref_text")


def decode_reference(clone: tts_pb2.VoiceClone, limits: RequestLimits, field: str = "clone") -> np.ndarray:
    """The reference audio as mono float32 at 24 kHz, decoded as the speaker stage will (CPU
    work: run it in a thread). INVALID_ARGUMENT for undecodable, empty, too long, bad rate or NaN
    audio."""
    encoding = REFERENCE_ENCODINGS[clone.ref_audio_encoding]
    rate = None if encoding == "file" else (clone.ref_audio_sample_rate or None)
    try:
        return load_audio(
            clone.ref_audio,
            rate,
            encoding=encoding,
            target_sample_rate=NATIVE_SAMPLE_RATE,
            limits=AudioLimits(max_seconds=limits.max_ref_audio_seconds),
        )
    except AudioError as exc:
        raise InvalidRequestError(f"{field}.ref_audio: {exc}") from exc


def default_text_feeding(model_type: str) -> int:
    """The official API's default: streaming text feeding for voice cloning (base models),
    non-streaming for preset speakers and voice design."""
    return tts_pb2.TEXT_FEEDING_STREAMING if model_type == "base" else tts_pb2.TEXT_FEEDING_NON_STREAMING


def resolve_text_feeding(text_feeding: int, info: tts_pb2.ModelInfo) -> int:
    """DEFAULT -> the model type's default; unknown values are rejected."""
    if text_feeding not in TEXT_FEEDINGS:
        raise InvalidRequestError(f"unknown text_feeding {text_feeding}")
    if text_feeding == tts_pb2.TEXT_FEEDING_DEFAULT:
        return default_text_feeding(info.model_type)
    return text_feeding


def default_sampling(info: tts_pb2.ModelInfo) -> SamplingParams:
    """The model's sampling defaults (``ModelInfo.default_sampling`` over the built-ins)."""
    return resolve_sampling(info.default_sampling, SamplingParams())


def max_new_tokens_limit(info: tts_pb2.ModelInfo) -> int:
    """Largest accepted ``max_new_tokens`` (the talker's, else the cap)."""
    return info.max_new_tokens_limit if info.max_new_tokens_limit > 0 else MAX_NEW_TOKENS_CAP


def plan_sampling(
    options: tts_pb2.SamplingOptions, info: tts_pb2.ModelInfo
) -> tuple[SamplingParams, int | None]:
    """Client values (checked) over the model defaults, the seed drawn if the client gave none,
    and ``max_new_tokens`` only if the client set it (the talker applies its runaway guard
    otherwise, whereas an explicit value is taken literally and refused if it cannot fit a slot)."""
    max_new_tokens = options.max_new_tokens if options.HasField("max_new_tokens") else None
    if max_new_tokens is not None:
        check_max_new_tokens(max_new_tokens, max_new_tokens_limit(info))
    sampling = resolve_sampling(options, default_sampling(info))
    if sampling.seed is None:
        sampling = sampling.replace(seed=new_seed())
    return sampling, max_new_tokens


def plan_synthesis(
    request: tts_pb2.SynthesizeRequest,
    info: tts_pb2.ModelInfo,
    limits: RequestLimits,
    *,
    streamed_text: bool = False,
) -> SynthesisPlan:
    """Check a request against the served model and resolve its defaults (reference audio is
    checked cheaply here and decoded by :func:`decode_reference`).

    ``streamed_text``: ``request`` is the configuration of a StreamingSynthesize stream: its
    ``text`` must be empty (the text arrives later; the plan's text is ""), and text feeding
    DEFAULT means STREAMING (the talker reads the text as it arrives)."""
    if streamed_text:
        if request.text:
            raise InvalidRequestError("config.text must be empty: send the text in `text` messages")
        text = ""
    else:
        text = check_text(request.text, limits.max_text_chars)
    language = resolve_language(request.language, info)
    kind: VoiceKind = request.WhichOneof("voice") or "none"  # type: ignore[assignment]
    check_voice_kind(kind, info)
    speaker = check_speaker(request.speaker, info) if kind == "speaker" else ""
    if kind == "voice_id" and not request.voice_id.strip():
        raise InvalidRequestError("voice_id is empty")
    clone = request.clone if kind == "clone" else None
    if clone is not None:
        check_clone(clone, limits)
    instruct = check_instruct(request.instruct, info, limits)
    text_feeding = resolve_text_feeding(request.text_feeding, info)
    if streamed_text and request.text_feeding == tts_pb2.TEXT_FEEDING_DEFAULT:
        text_feeding = tts_pb2.TEXT_FEEDING_STREAMING
    sampling, max_new_tokens = plan_sampling(request.sampling, info)
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
        max_new_tokens=max_new_tokens,
        silence_stop=request.silence_stop if request.HasField("silence_stop") else None,
    )


def check_speaker_embedding(size: int, expected: int, source: str = "speaker_embedding") -> None:
    """A voice-clone x-vector must have the talker's hidden size. FAILED_PRECONDITION: the voice
    (registered, computed by a speaker stage, or sent) was made for a different model."""
    if expected and size != expected:
        raise FailedPreconditionError(
            f"{source} has {size} values but the talker's model needs {expected} (a voice made with a different model?)"
        )


def check_reference_codes(codes: np.ndarray, num_codebooks: int, codebook_size: int, what: str) -> None:
    """Reference codes must be [frames >= 1, num_codebooks] integers in [0, codebook_size)."""
    if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] != num_codebooks:
        raise InvalidRequestError(
            f"{what} must have shape [frames>=1, {num_codebooks}], got {tuple(codes.shape)}"
        )
    if int(codes.min()) < 0 or int(codes.max()) >= codebook_size:
        raise InvalidRequestError(f"{what} must be integers in [0, {codebook_size})")


def check_talker_request(
    msg: stages_pb2.TalkerRequest,
    info: stages_pb2.TalkerInfo,
    ref_codes: np.ndarray | None,
    codebook_size: int,
) -> None:
    """What a talker must check itself because it depends on its checkpoint (the rest of the
    schema was checked by :func:`plan_synthesis` in the gateway): language, speaker, instruct,
    voice-clone inputs. Same functions, same messages."""
    model = info.model
    resolve_language(msg.language, model)
    clone = bool(len(msg.speaker_embedding))
    kind: VoiceKind = "speaker" if msg.speaker else ("clone" if clone else "none")
    check_voice_kind(kind, model)
    if msg.speaker:
        check_speaker(msg.speaker, model)
    if msg.instruct.strip():
        check_instruct_supported(model)
    if clone:
        check_speaker_embedding(len(msg.speaker_embedding), info.speaker_embedding_dim)
    if ref_codes is not None:
        if not clone:
            raise InvalidRequestError("ref_codes need a speaker_embedding (in-context voice clone)")
        check_reference_codes(ref_codes, model.num_codebooks, codebook_size, "ref_codes")
        if not msg.ref_text.strip():
            raise InvalidRequestError("ref_text (the reference transcript) is required with ref_codes")
    elif msg.ref_text.strip():
        raise InvalidRequestError("ref_text was given without ref_codes (in-context cloning needs both)")


def effective_model_info(talker: stages_pb2.TalkerInfo) -> tts_pb2.ModelInfo:
    """The talker's ModelInfo as served: ``max_new_tokens_limit`` filled in (the talker's, else
    its slot length, else the cap), ``default_sampling`` complete, ``sample_rate`` set."""
    info = tts_pb2.ModelInfo()
    info.CopyFrom(talker.model)
    if info.max_new_tokens_limit <= 0:
        info.max_new_tokens_limit = talker.max_seq_len or MAX_NEW_TOKENS_CAP
    defaults = sampling_to_options(default_sampling(info))  # every field but the seed
    reported = talker.model.default_sampling
    budget = reported.max_new_tokens if reported.HasField("max_new_tokens") else BUILTIN_MAX_NEW_TOKENS
    defaults.max_new_tokens = min(budget, info.max_new_tokens_limit)
    info.default_sampling.CopyFrom(defaults)
    if not info.sample_rate:
        info.sample_rate = NATIVE_SAMPLE_RATE
    return info


def plan_sampling_options(plan: SynthesisPlan) -> tts_pb2.SamplingOptions:
    """The plan's sampling as reported and forwarded: every field set (the seed included),
    ``max_new_tokens`` only if the client set it."""
    options = sampling_to_options(plan.sampling)
    if plan.max_new_tokens is not None:
        options.max_new_tokens = plan.max_new_tokens
    return options


def talker_request(
    plan: SynthesisPlan,
    request_id: str,
    *,
    speaker_embedding: list[float] | np.ndarray = (),  # type: ignore[assignment]
    ref_codes: stages_pb2.Codes | None = None,
    ref_text: str = "",
) -> stages_pb2.TalkerRequest:
    """The talker's request for a plan and its resolved voice (x-vector, and for in-context
    cloning the reference codes and transcript)."""
    msg = stages_pb2.TalkerRequest(
        request_id=request_id,
        text=plan.text,
        language=plan.language,
        speaker=plan.speaker,
        instruct=plan.instruct,
        speaker_embedding=[float(v) for v in speaker_embedding],
        ref_text=ref_text,
        text_feeding=plan.text_feeding,
        sampling=plan_sampling_options(plan),
        frames_per_chunk=1,
    )
    if ref_codes is not None and ref_codes.num_frames > 0:
        msg.ref_codes.CopyFrom(ref_codes)
    return msg


__all__ = [
    "NATIVE_SAMPLE_RATE",
    "native_sample_rate",
    "REFERENCE_ENCODINGS",
    "RequestLimits",
    "SynthesisPlan",
    "VoiceKind",
    "check_clone",
    "check_instruct",
    "check_instruct_supported",
    "check_reference_codes",
    "check_speaker",
    "check_speaker_embedding",
    "check_talker_request",
    "check_text",
    "check_voice_kind",
    "decode_reference",
    "default_sampling",
    "default_text_feeding",
    "effective_model_info",
    "max_new_tokens_limit",
    "model_label",
    "plan_sampling",
    "plan_sampling_options",
    "plan_synthesis",
    "resolve_language",
    "resolve_text_feeding",
    "talker_request",
]
