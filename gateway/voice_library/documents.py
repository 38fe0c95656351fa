"""Voices as JSON documents: the versioned export document (:func:`export_document`,
:func:`parse_document`) that moves a voice between deployments, and the legacy ``--voices-dir``
file (:func:`parse_legacy_file`: one JSON file per voice, as gateways before the library wrote
them; since several models behind one gateway also with ``family`` and ``design``).

The export document (``format`` ``qwen3-tts-voice``, ``format_version`` 1)::

    {"format": "qwen3-tts-voice", "format_version": 1, "exported_at": "2025-...Z",
     "voice": {"voice_id", "name", "description", "labels", "model_family", "model_name",
               "consent", "x_vector_only", "ref_text", "ref_audio_seconds", "audio_sha256",
               "created_at", "updated_at", "design": {...} | null,
               "speaker_embedding": [float, ...],
               "ref_codes": {"num_frames", "num_codebooks", "values": [int, ...]} | null}}

(``design``, how a designed voice was made, came after the first release of version 1: a reader
takes a document without it as a voice cloned from a recording.)

Embedding values are JSON numbers: a float32 widened to a double prints (``repr``) as the shortest
decimal that reads back to the same double, hence to the same float32, so the round trip is exact.
The owner is not exported (it is a digest under this deployment's secret): an import belongs to
the importing key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from tts_common.errors import InvalidRequestError

from .records import NewVoice, RefCodes, VoiceRecord, check_new_voice, datetime_from_us, now_us

logger = logging.getLogger(__name__)

DOCUMENT_FORMAT = "qwen3-tts-voice"
DOCUMENT_VERSION = 1
LEGACY_FORMAT_VERSION = 1
"""``format_version`` of the legacy voice files."""


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def export_document(record: VoiceRecord) -> dict[str, Any]:
    """The export document of ``record`` (JSON-serialisable)."""
    info = record.info
    codes = record.ref_codes
    return {
        "format": DOCUMENT_FORMAT,
        "format_version": DOCUMENT_VERSION,
        "exported_at": _time(datetime_from_us(now_us())),
        "voice": {
            "voice_id": info.voice_id,
            "name": info.name,
            "description": info.description,
            "labels": dict(info.labels),
            "model_family": info.model_family,
            "model_name": info.model_name,
            "consent": info.consent,
            "x_vector_only": info.x_vector_only,
            "ref_text": info.ref_text,
            "ref_audio_seconds": info.ref_audio_seconds,
            "audio_sha256": info.audio_sha256,
            "created_at": _time(info.created_at),
            "updated_at": _time(info.updated_at),
            "design": None if info.design is None else dict(info.design),
            "speaker_embedding": record.speaker_embedding.tolist(),
            "ref_codes": None
            if codes is None
            else {
                "num_frames": codes.num_frames,
                "num_codebooks": codes.num_codebooks,
                "values": codes.flat(),
            },
        },
    }


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise InvalidRequestError(f"voice document: {key!r} is missing")
        return default
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidRequestError(f"voice document: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _codes(data: Any) -> RefCodes | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise InvalidRequestError("voice document: 'ref_codes' must be an object or null")
    values = _field(data, "values", list)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidRequestError("voice document: 'ref_codes.values' must be integers")
    return RefCodes.from_flat(values, _field(data, "num_frames", int), _field(data, "num_codebooks", int))


def _embedding(values: list[Any]) -> list[float]:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise InvalidRequestError("voice document: 'speaker_embedding' must be numbers")
    return [float(v) for v in values]


def _parse_time(text: str, key: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidRequestError(f"voice document: {key!r} is not an ISO 8601 time: {text!r}") from exc
    if moment.tzinfo is None:
        raise InvalidRequestError(f"voice document: {key!r} needs a time zone: {text!r}")
    return moment


def _payload(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields both formats spell alike: the embedding, codes, transcript and reference."""
    return {
        "speaker_embedding": _embedding(_field(data, "speaker_embedding", list)),
        "ref_codes": _codes(data.get("ref_codes")),
        "x_vector_only": _field(data, "x_vector_only", bool),
        "ref_text": _field(data, "ref_text", str, ""),
        "name": _field(data, "name", str, ""),
        "model_name": _field(data, "model_name", str, ""),
        "ref_audio_seconds": float(_field(data, "ref_audio_seconds", (int, float), 0.0)),
        "audio_sha256": _field(data, "audio_sha256", str, ""),
    }


def _design(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The optional ``design`` object (null or absent: none)."""
    design = data.get("design")
    if design is not None and not isinstance(design, Mapping):
        raise InvalidRequestError("voice document: 'design' must be an object or null")
    return design


def parse_document(document: Any) -> NewVoice:
    """The voice of an export document (InvalidRequestError when it is not one, or of a newer
    version). Its id and creation time are kept as proposals; the fields are checked again by the
    library (``check_new_voice``)."""
    if not isinstance(document, Mapping):
        raise InvalidRequestError("voice document: expected a JSON object")
    if document.get("format") != DOCUMENT_FORMAT:
        raise InvalidRequestError(f"voice document: 'format' must be {DOCUMENT_FORMAT!r}")
    version = document.get("format_version")
    if version != DOCUMENT_VERSION:
        raise InvalidRequestError(
            f"voice document: unsupported format_version {version!r} (this server reads {DOCUMENT_VERSION})"
        )
    voice = document.get("voice")
    if not isinstance(voice, Mapping):
        raise InvalidRequestError("voice document: 'voice' must be an object")
    return NewVoice(
        **_payload(voice),
        description=_field(voice, "description", str, ""),
        labels=_field(voice, "labels", dict, {}),
        model_family=_field(voice, "model_family", str, ""),
        consent=_field(voice, "consent", str, ""),
        voice_id=_field(voice, "voice_id", str, None),
        created_at=_parse_time(_field(voice, "created_at", str), "created_at")
        if "created_at" in voice
        else None,
        design=_design(voice),
    )


def parse_legacy_file(data: Any) -> NewVoice:
    """A voice file of the legacy ``--voices-dir``: InvalidRequestError when malformed. Its
    ``family`` (files written since several models behind one gateway; "" before) and ``design``
    are kept; owner and consent are not in that format, the importer sets them."""
    if not isinstance(data, Mapping):
        raise InvalidRequestError("legacy voice file: expected a JSON object")
    if data.get("format_version") != LEGACY_FORMAT_VERSION:
        raise InvalidRequestError(
            f"legacy voice file: unsupported format_version {data.get('format_version')!r}"
        )
    created = Timestamp()
    try:
        created.FromJsonString(_field(data, "created_at", str))
    except ValueError as exc:
        raise InvalidRequestError(f"legacy voice file: bad created_at: {exc}") from exc
    return NewVoice(
        **_payload(data),
        voice_id=_field(data, "voice_id", str),
        created_at=datetime_from_us(created.ToMicroseconds()),
        model_family=_field(data, "family", str, ""),
        design=_design(data),
    )


def read_legacy_directory(directory: Path) -> tuple[list[NewVoice], list[str]]:
    """The voices of a legacy ``--voices-dir`` (its ``voice-*.json`` files, checked, in name
    order) and the names of the files that are not readable voices (logged). A missing directory
    has none. Blocking: run it in a thread."""
    voices: list[NewVoice] = []
    skipped: list[str] = []
    if not directory.is_dir():
        return voices, skipped
    for path in sorted(directory.glob("voice-*.json")):
        try:
            voice = check_new_voice(parse_legacy_file(json.loads(path.read_text(encoding="utf-8"))))
            if voice.voice_id != path.stem:
                raise InvalidRequestError(f"the file holds voice {voice.voice_id!r}")
        except (OSError, ValueError) as exc:  # InvalidRequestError and JSON errors are ValueErrors
            logger.warning("legacy voice file %s skipped: %s", path, exc)
            skipped.append(path.name)
            continue
        voices.append(voice)
    return voices, skipped


__all__ = [
    "DOCUMENT_FORMAT",
    "DOCUMENT_VERSION",
    "LEGACY_FORMAT_VERSION",
    "export_document",
    "parse_document",
    "parse_legacy_file",
    "read_legacy_directory",
]
