"""SQL shared by both back ends: the :class:`Transaction` a back end provides, the voice columns,
rows to records and back, and the row-level steps of the operations (insert a voice, append to
the audit trail), each a function of a transaction."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from tts_common.errors import InvalidRequestError

from .records import NewVoice, RefCodes, VoiceInfo, VoiceRecord, datetime_from_us, now_us, us_from_datetime
from .scope import Scope

Lock = Literal["migrate", "admit"]
"""The cross-process locks a back end provides: schema changes, and count-then-insert."""

INFO_COLUMNS = (
    "voice_id, owner, name, description, labels, model_family, model_name, consent, x_vector_only, "
    "ref_text, ref_audio_seconds, audio_sha256, created_us, updated_us, design"
)
RECORD_COLUMNS = INFO_COLUMNS + ", embedding, codes, code_frames, code_books"


class Transaction(Protocol):
    """SQL on one connection (inside a transaction for writes). Placeholders are ``$1, $2, ...``
    for both dialects; rows are read by column name."""

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def fetch(self, sql: str, *args: Any) -> Sequence[Mapping[str, Any]]: ...

    async def fetchrow(self, sql: str, *args: Any) -> Mapping[str, Any] | None: ...


def labels_json(labels: Mapping[str, str]) -> str:
    """Labels as stored (a JSON object, keys sorted)."""
    return json.dumps(dict(labels), sort_keys=True, ensure_ascii=False)


def info_from_row(row: Mapping[str, Any]) -> VoiceInfo:
    return VoiceInfo(
        voice_id=row["voice_id"],
        owner=row["owner"],
        name=row["name"],
        description=row["description"],
        labels=json.loads(row["labels"]),
        model_family=row["model_family"],
        model_name=row["model_name"],
        consent=row["consent"],
        x_vector_only=bool(row["x_vector_only"]),
        ref_text=row["ref_text"],
        ref_audio_seconds=float(row["ref_audio_seconds"]),
        audio_sha256=row["audio_sha256"],
        created_at=datetime_from_us(int(row["created_us"])),
        updated_at=datetime_from_us(int(row["updated_us"])),
        design=json.loads(row["design"]) if row["design"] else None,
    )


def record_from_row(row: Mapping[str, Any]) -> VoiceRecord:
    embedding = np.frombuffer(bytes(row["embedding"]), dtype="<f4").astype(np.float32)
    embedding.setflags(write=False)
    codes = row["codes"]
    return VoiceRecord(
        info=info_from_row(row),
        speaker_embedding=embedding,
        ref_codes=None
        if codes is None
        else RefCodes.from_bytes(bytes(codes), int(row["code_frames"]), int(row["code_books"])),
    )


def token_after(info: VoiceInfo) -> str:
    """The opaque token of the listing position after ``info`` (order: created, then id)."""
    raw = json.dumps([us_from_datetime(info.created_at), info.voice_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def position_of(token: str) -> tuple[int, str] | None:
    """Inverse of :func:`token_after` (None for the first page); InvalidRequestError if forged."""
    if not token:
        return None
    try:
        created, voice_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if isinstance(created, int) and isinstance(voice_id, str):
            return created, voice_id
    except (binascii.Error, ValueError, TypeError):
        pass
    raise InvalidRequestError("malformed page_token (pass back next_page_token as received)")


async def voice_exists(tx: Transaction, voice_id: str) -> bool:
    return await tx.fetchrow("SELECT 1 AS one FROM voices WHERE voice_id = $1", voice_id) is not None


async def insert_voice(tx: Transaction, voice: NewVoice, voice_id: str, owner: str) -> VoiceRecord:
    """Insert a checked voice under ``voice_id`` for ``owner``; the stored record."""
    now = now_us()
    created = now if voice.created_at is None else us_from_datetime(voice.created_at)
    codes = voice.ref_codes
    embedding = np.asarray(voice.speaker_embedding, dtype=np.float32)
    row = await tx.fetchrow(
        f"INSERT INTO voices ({RECORD_COLUMNS}) VALUES "
        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) "
        f"RETURNING {RECORD_COLUMNS}",
        voice_id,
        owner,
        voice.name,
        voice.description,
        labels_json(voice.labels),
        voice.model_family,
        voice.model_name,
        voice.consent,
        voice.x_vector_only,
        voice.ref_text,
        voice.ref_audio_seconds,
        voice.audio_sha256,
        created,
        now,
        "" if voice.design is None else json.dumps(dict(voice.design), sort_keys=True, ensure_ascii=False),
        embedding.astype("<f4").tobytes(),
        None if codes is None else codes.to_bytes(),
        0 if codes is None else codes.num_frames,
        0 if codes is None else codes.num_codebooks,
    )
    assert row is not None
    return record_from_row(row)


async def append_audit(
    tx: Transaction, scope: Scope, action: str, voice_id: str, detail: Mapping[str, Any]
) -> None:
    """One line of the audit trail, in the transaction of the change it records."""
    await tx.execute(
        "INSERT INTO voice_audit (at_us, actor, admin, action, voice_id, detail) VALUES ($1, $2, $3, $4, $5, $6)",
        now_us(),
        scope.owner,
        scope.admin,
        action,
        voice_id,
        json.dumps(dict(detail), sort_keys=True, ensure_ascii=False),
    )


__all__ = [
    "INFO_COLUMNS",
    "Lock",
    "RECORD_COLUMNS",
    "Transaction",
    "append_audit",
    "info_from_row",
    "insert_voice",
    "labels_json",
    "token_after",
    "position_of",
    "record_from_row",
    "voice_exists",
]
