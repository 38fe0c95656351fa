"""The voice library: registered (cloned) voices shared by every gateway replica, each owned by
the API key that registered it.

Design
------
* **One interface, two back ends.** :class:`VoiceLibrary` implements every operation once, in SQL
  written for both dialects; a back end supplies connections, its locks and which of its errors
  mean "unavailable". :class:`SqliteVoiceLibrary` (the embedded default: one file, WAL,
  aiosqlite) serves one gateway or several on one host; :class:`PostgresVoiceLibrary` (asyncpg,
  a connection pool) serves replicas on many hosts. :func:`create_voice_library` picks one from
  ``postgresql://...``, ``sqlite:///path`` or a plain path.
* **Schema** (:mod:`.schema`): versioned, additive migrations applied at startup under the back
  end's migration lock (PostgreSQL advisory lock; SQLite ``BEGIN IMMEDIATE``), recorded in
  ``schema_migrations``; idempotent, and concurrent startups apply each migration once.
* **Records** (:mod:`.records`): id, owner, name, description, labels, model family (a string
  the gateway derives), model name, consent, times, and the biometric payload: the float32
  speaker embedding and int32 reference codes stored as little-endian bytes (exact round trip),
  the transcript, ``x_vector_only``, the reference duration and audio digest.
* **Ownership** (:mod:`.scope`): the owner is HMAC-SHA256 of the API key under a server secret
  (configured, or generated once into the database); ``""`` when keys are off. A call's
  :class:`Caller` (its key, as the transports saw it) becomes a :class:`Scope` only when it
  touches a voice (:meth:`VoiceLibrary.scope_of`). Another owner's
  voice is NotFoundError on get, update, delete and export, and absent from listings, so ids do
  not leak; the admin :class:`Scope` sees every voice.
* **Limits**: ``max_voices`` over the library and ``max_voices_per_owner``, checked and inserted
  under one lock (CapacityError, RESOURCE_EXHAUSTED).
* **Consistency across replicas**: no in-process cache. A lookup is one indexed query (tens of
  microseconds on SQLite, a few hundred on PostgreSQL over loopback; ``bench/voice_store.py``),
  negligible beside a synthesis, so a voice added or deleted through any replica is seen by the
  next lookup through every other one; there is nothing to invalidate.
* **Failures**: every operation runs under ``timeout_s``; a database down, unreachable, locked or
  slow raises :class:`VoiceStoreUnavailableError` (UNAVAILABLE, with ``retry_after_s``). A write
  is acknowledged only after its commit (durable: SQLite ``synchronous=FULL``, PostgreSQL
  ``synchronous_commit``); one interrupted raises, and its connection is discarded.
* **Audit**: registrations, imports, updates, deletions and exports append to ``voice_audit`` in
  the same transaction as the change (triggers refuse UPDATE and DELETE of the trail).
* **Moving voices**: :meth:`VoiceLibrary.export` gives a versioned JSON document
  (:mod:`.documents`) that :meth:`VoiceLibrary.import_document` reads back; a legacy
  ``--voices-dir`` (the JSON files gateways wrote before the library) is imported once by
  :meth:`VoiceLibrary.import_legacy_directory`.
"""

from __future__ import annotations

from .config import VoiceLibraryConfig
from .documents import DOCUMENT_FORMAT, DOCUMENT_VERSION, export_document, parse_document
from .errors import VoiceStoreUnavailableError
from .factory import create_voice_library
from .library import LegacyImport, VoiceLibrary
from .postgres import PostgresVoiceLibrary
from .records import (
    AuditEntry,
    NewVoice,
    RefCodes,
    VoiceInfo,
    VoicePage,
    VoicePatch,
    VoiceRecord,
    new_voice_id,
)
from .schema import LATEST_VERSION
from .scope import ANONYMOUS, NO_KEYS, Caller, OwnerDigest, Scope
from .sqlite import SqliteVoiceLibrary

__all__ = [
    "ANONYMOUS",
    "AuditEntry",
    "Caller",
    "DOCUMENT_FORMAT",
    "DOCUMENT_VERSION",
    "LATEST_VERSION",
    "LegacyImport",
    "NO_KEYS",
    "NewVoice",
    "OwnerDigest",
    "PostgresVoiceLibrary",
    "RefCodes",
    "Scope",
    "SqliteVoiceLibrary",
    "VoiceInfo",
    "VoiceLibrary",
    "VoiceLibraryConfig",
    "VoicePage",
    "VoicePatch",
    "VoiceRecord",
    "VoiceStoreUnavailableError",
    "create_voice_library",
    "export_document",
    "new_voice_id",
    "parse_document",
]
