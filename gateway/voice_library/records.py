"""What the voice library stores: :class:`NewVoice` (what a registration supplies),
:class:`VoiceInfo` (a voice's metadata, what listings return), :class:`VoiceRecord` (the metadata
with the speaker embedding and reference codes, what synthesis needs), :class:`VoicePatch` (a
PATCH), and the one check of every field (:func:`check_new_voice`, :func:`check_patch`).

Embeddings are float32 and reference codes int32; both are kept as numpy arrays and stored as their
little-endian bytes, so they round-trip bit for bit.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tts_common.errors import InvalidRequestError

VOICE_ID_PATTERN = re.compile(r"^voice-[0-9a-f]{32}$")
"""The form of a voice id: ``voice-`` and 32 lower-case hex digits (also that of the legacy
voice files)."""

MAX_NAME_CHARS = 200
"""Longest voice name (the gateway checks a registration's fields with :func:`check_metadata`
before the reference is embedded)."""
MAX_DESCRIPTION_CHARS = 2000
"""Longest description."""
MAX_CONSENT_CHARS = 4000
"""Longest consent text or id."""
MAX_LABELS = 32
"""Most labels on one voice."""
MAX_LABEL_KEY_CHARS = 64
"""Longest label key (``[A-Za-z0-9_.:-]``)."""
MAX_LABEL_VALUE_CHARS = 200
"""Longest label value."""
MAX_TEXT_CHARS = 100_000
"""Longest transcript (``ref_text``), model family and model name are far below it."""
MAX_EMBEDDING_DIM = 16_384
"""Longest speaker embedding (the released talkers use 1024 and 2048)."""
MAX_REF_CODES = 4_000_000
"""Most reference code values (frames x codebooks)."""
MAX_DESIGN_CHARS = 16_000
"""Longest design record (its JSON text)."""

_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.:-]+$")
_SHA256 = re.compile(r"^([0-9a-f]{64})?$")
_INT32 = np.iinfo(np.int32)


def new_voice_id() -> str:
    """A fresh voice id (``voice-`` + 32 hex digits)."""
    return f"voice-{uuid.uuid4().hex}"


def now_us() -> int:
    """Now, in whole microseconds since the Unix epoch (the stored time unit)."""
    return time.time_ns() // 1000


def datetime_from_us(us: int) -> datetime:
    """A stored time as an aware UTC datetime (exact: microsecond resolution)."""
    seconds, micros = divmod(us, 1_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).replace(microsecond=micros)


def us_from_datetime(moment: datetime) -> int:
    """Inverse of :func:`datetime_from_us` (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True, eq=False)
class RefCodes:
    """Reference codes of an in-context voice: ``values[frame, codebook]``, int32."""

    values: np.ndarray
    """Shape (num_frames, num_codebooks), dtype int32, read-only."""

    @classmethod
    def from_flat(cls, values: Sequence[int] | np.ndarray, num_frames: int, num_codebooks: int) -> RefCodes:
        """From the flat frame-major layout of ``stages_pb2.Codes`` (InvalidRequestError when the
        size does not match or a value does not fit int32)."""
        flat = np.asarray(values)
        if flat.ndim != 1 or num_frames < 0 or num_codebooks < 0 or flat.size != num_frames * num_codebooks:
            raise InvalidRequestError(
                f"ref_codes: {flat.size} values do not make {num_frames} frames x {num_codebooks} codebooks"
            )
        if flat.size and (flat.dtype.kind not in "iu" or flat.min() < _INT32.min or flat.max() > _INT32.max):
            raise InvalidRequestError("ref_codes: values must be integers that fit in 32 bits")
        array = flat.astype(np.int32).reshape(num_frames, num_codebooks)
        array.setflags(write=False)
        return cls(array)

    @property
    def num_frames(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_codebooks(self) -> int:
        return int(self.values.shape[1])

    def flat(self) -> list[int]:
        """The values frame-major, as ``stages_pb2.Codes.values`` takes them."""
        return self.values.reshape(-1).tolist()

    def to_bytes(self) -> bytes:
        return self.values.astype("<i4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, num_frames: int, num_codebooks: int) -> RefCodes:
        array = np.frombuffer(data, dtype="<i4").astype(np.int32).reshape(num_frames, num_codebooks)
        array.setflags(write=False)
        return cls(array)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefCodes) and np.array_equal(self.values, other.values)

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type: equal, not hashable


def embedding_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """A speaker embedding as a read-only 1-D float32 array (InvalidRequestError when it is empty,
    too long, not 1-D or not finite)."""
    array = np.asarray(values)
    if array.dtype.kind not in "fiu":
        raise InvalidRequestError("speaker_embedding: values must be numbers")
    array = array.astype(np.float32)
    if array.ndim != 1 or not 0 < array.size <= MAX_EMBEDDING_DIM:
        raise InvalidRequestError(
            f"speaker_embedding: need 1 to {MAX_EMBEDDING_DIM} values in one dimension, got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        raise InvalidRequestError("speaker_embedding: values must be finite")
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class VoiceInfo:
    """A stored voice's metadata (no biometric payload): what listings return."""

    voice_id: str
    owner: str
    """Keyed digest of the API key that registered it (:class:`OwnerDigest`); ``""`` without keys."""
    name: str
    description: str
    labels: Mapping[str, str]
    model_family: str
    """The model family the embedding and codes belong to (set by the gateway)."""
    model_name: str
    """The checkpoint the voice was registered with (diagnostics)."""
    consent: str
    """The consent text or id recorded at registration."""
    x_vector_only: bool
    ref_text: str
    """Transcript of the reference audio (empty for x-vector-only voices)."""
    ref_audio_seconds: float
    audio_sha256: str
    created_at: datetime
    updated_at: datetime
    design: Mapping[str, Any] | None = None
    """How a designed voice was made (the gateway's ``VoiceDesign`` as a JSON object: the
    instruction, text, language, seed and model); None for a voice cloned from a recording."""


@dataclass(frozen=True, eq=False)
class VoiceRecord:
    """A stored voice with what the talker needs to speak with it."""

    info: VoiceInfo
    speaker_embedding: np.ndarray
    """The x-vector, float32, read-only."""
    ref_codes: RefCodes | None
    """Reference codes for in-context cloning; None for x-vector-only voices."""

    @property
    def voice_id(self) -> str:
        return self.info.voice_id

    def __eq__(self, other: object) -> bool:
        """Exact equality: metadata, and the embedding and codes bit for bit."""
        return (
            isinstance(other, VoiceRecord)
            and self.info == other.info
            and self.speaker_embedding.tobytes() == other.speaker_embedding.tobytes()
            and self.ref_codes == other.ref_codes
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class NewVoice:
    """What registering (or importing) a voice supplies; the library adds owner and times."""

    speaker_embedding: np.ndarray | Sequence[float]
    ref_codes: RefCodes | None
    x_vector_only: bool
    ref_text: str = ""
    name: str = ""
    description: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    model_family: str = ""
    model_name: str = ""
    consent: str = ""
    ref_audio_seconds: float = 0.0
    audio_sha256: str = ""
    voice_id: str | None = None
    """A chosen id (imports keep theirs when free); None: a fresh one."""
    created_at: datetime | None = None
    """Kept by imports; None: now."""
    design: Mapping[str, Any] | None = None
    """How a designed voice was made (:attr:`VoiceInfo.design`)."""


@dataclass(frozen=True)
class VoicePatch:
    """A PATCH of a voice's metadata: None leaves a field as it is; ``labels`` replaces the map."""

    name: str | None = None
    description: str | None = None
    labels: Mapping[str, str] | None = None

    def changed_fields(self) -> list[str]:
        return [name for name in ("name", "description", "labels") if getattr(self, name) is not None]


@dataclass(frozen=True)
class VoicePage:
    """One page of a listing; ``next_page_token`` is empty on the last page."""

    voices: tuple[VoiceInfo, ...]
    next_page_token: str = ""


@dataclass(frozen=True)
class AuditEntry:
    """One line of the append-only audit trail."""

    seq: int
    """Increasing position in the trail."""
    at: datetime
    actor: str
    """Owner digest of the caller (``""`` without keys)."""
    admin: bool
    """Whether the caller acted with the admin scope."""
    action: str
    """``register``, ``import``, ``legacy_import``, ``update``, ``delete`` or ``export``."""
    voice_id: str
    detail: Mapping[str, Any]
    """Non-biometric context: the name, the changed fields, the source of an import."""


def _check_text(what: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string")
    if len(value) > limit:
        raise InvalidRequestError(f"{what} is too long: {len(value)} characters (maximum {limit})")
    if "\x00" in value:
        raise InvalidRequestError(f"{what} contains a NUL character")
    return value


def check_labels(labels: object) -> dict[str, str]:
    """Labels as a plain dict, or InvalidRequestError."""
    if not isinstance(labels, Mapping):
        raise InvalidRequestError("labels must be a map of strings to strings")
    if len(labels) > MAX_LABELS:
        raise InvalidRequestError(f"too many labels: {len(labels)} (maximum {MAX_LABELS})")
    checked: dict[str, str] = {}
    for key, value in labels.items():
        _check_text("label key", key, MAX_LABEL_KEY_CHARS)
        if not _LABEL_KEY.match(key):
            raise InvalidRequestError(f"label key {key!r}: use letters, digits and _ . : -")
        checked[key] = _check_text(f"label {key!r}", value, MAX_LABEL_VALUE_CHARS)
    return checked


def check_design(design: object) -> dict[str, Any] | None:
    """A design record as a plain JSON object (None stays None), or InvalidRequestError."""
    if design is None:
        return None
    if not isinstance(design, Mapping) or not all(isinstance(key, str) for key in design):
        raise InvalidRequestError("design must be a JSON object")
    try:
        text = json.dumps(dict(design), sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"design is not plain JSON: {exc}") from None
    if len(text) > MAX_DESIGN_CHARS:
        raise InvalidRequestError(f"design is too long: {len(text)} characters (maximum {MAX_DESIGN_CHARS})")
    checked: dict[str, Any] = json.loads(text)
    return checked


def check_voice_id(voice_id: str) -> str:
    if not isinstance(voice_id, str) or not VOICE_ID_PATTERN.match(voice_id):
        raise InvalidRequestError(f"malformed voice_id {voice_id!r} (voice- and 32 hex digits)")
    return voice_id


def check_metadata(
    *, name: str = "", description: str = "", consent: str = "", labels: Mapping[str, str] | None = None
) -> None:
    """The checks :func:`check_new_voice` makes of what a user names and describes a voice with,
    for a registration to fail fast, before its reference is embedded."""
    _check_text("name", name, MAX_NAME_CHARS)
    _check_text("description", description, MAX_DESCRIPTION_CHARS)
    _check_text("consent", consent, MAX_CONSENT_CHARS)
    if labels is not None:
        check_labels(labels)


def check_new_voice(voice: NewVoice) -> NewVoice:
    """The one check of a voice's fields; returns it with the embedding as float32 and the
    labels as a plain dict. InvalidRequestError names the first bad field."""
    embedding = embedding_array(voice.speaker_embedding)
    if voice.x_vector_only != (voice.ref_codes is None):
        raise InvalidRequestError("an x-vector-only voice has no ref_codes; an in-context voice needs them")
    if voice.ref_codes is not None and voice.ref_codes.values.size > MAX_REF_CODES:
        raise InvalidRequestError(f"ref_codes: more than {MAX_REF_CODES} values")
    if voice.voice_id is not None:
        check_voice_id(voice.voice_id)
    check_metadata(name=voice.name, description=voice.description, consent=voice.consent)
    for what, limit in (
        ("ref_text", MAX_TEXT_CHARS),
        ("model_family", MAX_NAME_CHARS),
        ("model_name", MAX_NAME_CHARS),
    ):
        _check_text(what, getattr(voice, what), limit)
    if not isinstance(voice.audio_sha256, str) or not _SHA256.match(voice.audio_sha256):
        raise InvalidRequestError("audio_sha256 must be empty or 64 lower-case hex digits")
    seconds = voice.ref_audio_seconds
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise InvalidRequestError("ref_audio_seconds must be a finite number >= 0")
    return NewVoice(
        speaker_embedding=embedding,
        ref_codes=voice.ref_codes,
        x_vector_only=bool(voice.x_vector_only),
        ref_text=voice.ref_text,
        name=voice.name,
        description=voice.description,
        labels=check_labels(voice.labels),
        model_family=voice.model_family,
        model_name=voice.model_name,
        consent=voice.consent,
        ref_audio_seconds=float(seconds),
        audio_sha256=voice.audio_sha256,
        voice_id=voice.voice_id,
        created_at=voice.created_at,
        design=check_design(voice.design),
    )


def check_patch(patch: VoicePatch) -> VoicePatch:
    """The checks of a PATCH (the same limits as a registration)."""
    return VoicePatch(
        name=None if patch.name is None else _check_text("name", patch.name, MAX_NAME_CHARS),
        description=None
        if patch.description is None
        else _check_text("description", patch.description, MAX_DESCRIPTION_CHARS),
        labels=None if patch.labels is None else check_labels(patch.labels),
    )


__all__ = [
    "AuditEntry",
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "NewVoice",
    "RefCodes",
    "VOICE_ID_PATTERN",
    "VoiceInfo",
    "VoicePage",
    "VoicePatch",
    "VoiceRecord",
    "check_design",
    "check_labels",
    "check_metadata",
    "check_new_voice",
    "check_patch",
    "check_voice_id",
    "datetime_from_us",
    "embedding_array",
    "new_voice_id",
    "now_us",
    "us_from_datetime",
]
