"""The voice library's versioned schema: :data:`MIGRATIONS`, each with its DDL for both back ends,
applied in order at startup and recorded in ``schema_migrations``.

Rules for a new migration: append it (never edit an applied one), keep it additive (new tables,
new columns with defaults, new indexes) so a gateway of the previous release keeps working against
the upgraded schema during a rolling update, and write it for both dialects. The runner
(``VoiceLibrary.start``) holds the back end's migration lock (a PostgreSQL advisory lock, SQLite's
write lock) for the whole check-and-apply, so gateways starting together never race.

Tables (version 1):

* ``voices``: one row per voice. ``owner`` is the keyed digest of the registering API key
  (``""`` without keys); ``labels`` a JSON object; times are microseconds since the Unix epoch
  (``created_us``, ``updated_us``); ``embedding`` the float32 little-endian bytes of the speaker
  embedding; ``codes`` the int32 little-endian bytes of the reference codes, frame-major
  (``code_frames`` x ``code_books``; NULL for x-vector-only voices).
* ``voice_audit``: the append-only audit trail (triggers refuse UPDATE and DELETE).
* ``library_meta``: key/value settings of the library (the generated owner secret).
* ``legacy_imports``: the legacy ``--voices-dir`` directories already imported.
* ``schema_migrations``: the applied versions.

Version 2 adds ``voices.design``: how a designed voice was made (a JSON object), ``''`` for a
voice cloned from a recording.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .records import now_us

if TYPE_CHECKING:
    from .sql import Transaction

logger = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgresql"]

MIGRATIONS_TABLE = {
    "sqlite": """CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        applied_us INTEGER NOT NULL) STRICT""",
    "postgresql": """CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY,
        description TEXT NOT NULL,
        applied_us BIGINT NOT NULL)""",
}


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: dict[Dialect, tuple[str, ...]]


def _voices(blob: str, boolean: str, bigint: str, double: str, strict: str) -> str:
    return f"""CREATE TABLE voices (
        voice_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        description TEXT NOT NULL,
        labels TEXT NOT NULL,
        model_family TEXT NOT NULL,
        model_name TEXT NOT NULL,
        consent TEXT NOT NULL,
        x_vector_only {boolean} NOT NULL,
        ref_text TEXT NOT NULL,
        ref_audio_seconds {double} NOT NULL,
        audio_sha256 TEXT NOT NULL,
        created_us {bigint} NOT NULL,
        updated_us {bigint} NOT NULL,
        embedding {blob} NOT NULL,
        codes {blob},
        code_frames INTEGER NOT NULL,
        code_books INTEGER NOT NULL){strict}"""


_COMMON_V1 = (
    "CREATE INDEX voices_by_owner ON voices (owner, created_us, voice_id)",
    "CREATE INDEX voices_by_time ON voices (created_us, voice_id)",
    "CREATE INDEX voice_audit_by_voice ON voice_audit (voice_id, seq)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "voices, audit trail, library settings, legacy imports",
        {
            "sqlite": (
                _voices("BLOB", "INTEGER", "INTEGER", "REAL", " STRICT"),
                """CREATE TABLE voice_audit (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT,
                    at_us INTEGER NOT NULL,
                    actor TEXT NOT NULL,
                    admin INTEGER NOT NULL,
                    action TEXT NOT NULL,
                    voice_id TEXT NOT NULL,
                    detail TEXT NOT NULL) STRICT""",
                """CREATE TRIGGER voice_audit_no_update BEFORE UPDATE ON voice_audit
                    BEGIN SELECT RAISE(ABORT, 'voice_audit is append-only'); END""",
                """CREATE TRIGGER voice_audit_no_delete BEFORE DELETE ON voice_audit
                    BEGIN SELECT RAISE(ABORT, 'voice_audit is append-only'); END""",
                "CREATE TABLE library_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT",
                """CREATE TABLE legacy_imports (
                    source TEXT PRIMARY KEY,
                    imported_us INTEGER NOT NULL,
                    imported INTEGER NOT NULL,
                    skipped INTEGER NOT NULL) STRICT""",
                *_COMMON_V1,
            ),
            "postgresql": (
                _voices("BYTEA", "BOOLEAN", "BIGINT", "DOUBLE PRECISION", ""),
                """CREATE TABLE voice_audit (
                    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    at_us BIGINT NOT NULL,
                    actor TEXT NOT NULL,
                    admin BOOLEAN NOT NULL,
                    action TEXT NOT NULL,
                    voice_id TEXT NOT NULL,
                    detail TEXT NOT NULL)""",
                """CREATE FUNCTION voice_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN RAISE EXCEPTION 'voice_audit is append-only'; END $$""",
                """CREATE TRIGGER voice_audit_append_only BEFORE UPDATE OR DELETE ON voice_audit
                    FOR EACH ROW EXECUTE FUNCTION voice_audit_append_only()""",
                "CREATE TABLE library_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
                """CREATE TABLE legacy_imports (
                    source TEXT PRIMARY KEY,
                    imported_us BIGINT NOT NULL,
                    imported INTEGER NOT NULL,
                    skipped INTEGER NOT NULL)""",
                *_COMMON_V1,
            ),
        },
    ),
    Migration(
        2,
        "voices.design: how a designed voice was made",
        {
            "sqlite": ("ALTER TABLE voices ADD COLUMN design TEXT NOT NULL DEFAULT ''",),
            "postgresql": ("ALTER TABLE voices ADD COLUMN design TEXT NOT NULL DEFAULT ''",),
        },
    ),
)
"""Every migration, oldest first; versions are 1, 2, ... without gaps."""

LATEST_VERSION = MIGRATIONS[-1].version
OWNER_SECRET_KEY = "owner_secret"
"""``library_meta`` key of the generated owner secret (hex)."""


async def apply_migrations(tx: Transaction, dialect: Dialect, location: str) -> str:
    """Bring the schema up to date inside ``tx`` (which must hold the back end's migration lock)
    and make sure the library has an owner secret; returns that secret (hex)."""
    await tx.execute(MIGRATIONS_TABLE[dialect])
    applied = {int(row["version"]) for row in await tx.fetch("SELECT version FROM schema_migrations")}
    for migration in MIGRATIONS:
        if migration.version in applied:
            continue
        for statement in migration.statements[dialect]:
            await tx.execute(statement)
        await tx.execute(
            "INSERT INTO schema_migrations (version, description, applied_us) VALUES ($1, $2, $3)",
            migration.version,
            migration.description,
            now_us(),
        )
        logger.info("voice library %s: applied schema version %d", location, migration.version)
    if applied and max(applied) > LATEST_VERSION:
        logger.warning(
            "voice library %s: schema version %d is newer than this gateway's %d (migrations are additive, "
            "so it keeps working; upgrade the gateway)",
            location,
            max(applied),
            LATEST_VERSION,
        )
    await tx.execute(
        "INSERT INTO library_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        OWNER_SECRET_KEY,
        secrets.token_hex(32),
    )
    row = await tx.fetchrow("SELECT value FROM library_meta WHERE key = $1", OWNER_SECRET_KEY)
    assert row is not None
    return str(row["value"])


__all__ = [
    "Dialect",
    "LATEST_VERSION",
    "MIGRATIONS",
    "MIGRATIONS_TABLE",
    "Migration",
    "OWNER_SECRET_KEY",
    "apply_migrations",
]
