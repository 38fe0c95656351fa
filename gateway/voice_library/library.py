"""The voice library's interface and its one implementation of every operation
(:class:`VoiceLibrary`), over the few primitives a back end provides (a connection or a
transaction running SQL written once for both dialects, its locks, and which of its errors mean
"unavailable").

Every operation runs under ``config.timeout_s``; a database that is down, unreachable, locked or
too slow raises :class:`VoiceStoreUnavailableError` (never a hang). A write returns only after its
transaction committed (the back ends commit durably: SQLite ``synchronous=FULL``, PostgreSQL's
default ``synchronous_commit``), so an acknowledged voice is never lost; an interrupted one raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from tts_common.errors import AlreadyExistsError, CapacityError, InvalidRequestError, NotFoundError, TTSError

from .config import VoiceLibraryConfig
from .documents import export_document, parse_document, read_legacy_directory
from .errors import VoiceStoreUnavailableError
from .records import (
    VOICE_ID_PATTERN,
    AuditEntry,
    NewVoice,
    VoiceInfo,
    VoicePage,
    VoicePatch,
    VoiceRecord,
    check_new_voice,
    check_patch,
    datetime_from_us,
    new_voice_id,
    now_us,
)
from .schema import Dialect, apply_migrations
from .scope import Caller, OwnerDigest, Scope
from .sql import (
    INFO_COLUMNS,
    RECORD_COLUMNS,
    Lock,
    Transaction,
    append_audit,
    info_from_row,
    insert_voice,
    labels_json,
    position_of,
    record_from_row,
    token_after,
    voice_exists,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_PAGE_SIZE = 1000
"""Largest page of a listing or of the audit trail."""


@dataclass(frozen=True)
class LegacyImport:
    """What importing a legacy ``--voices-dir`` did."""

    source: str
    """The directory (absolute), as recorded."""
    imported: int
    """Voices added."""
    already_present: int
    """Voices whose id was already in the library (left as they are)."""
    skipped_files: tuple[str, ...]
    """Files that could not be read as voices (logged)."""
    already_done: bool = False
    """The directory had been imported before: nothing was read."""


def _not_found(voice_id: str) -> NotFoundError:
    return NotFoundError(f"unknown voice_id {voice_id!r} (see ListVoices)")


class VoiceLibrary(ABC):
    """Stored voices shared by every gateway over one database, each owned by the API key that
    registered it. Create with :func:`create_voice_library`; :meth:`start` (or the first
    operation) connects and applies the schema; :meth:`close` at shutdown."""

    dialect: Dialect

    def __init__(self, config: VoiceLibraryConfig) -> None:
        self.config = config
        self._opened = False
        """The back end's connections are set up (:meth:`_open` ran)."""
        self._ready = False
        """The schema is up to date and the owner digest known."""
        self._closed = False
        self._start_lock = asyncio.Lock()
        self._owner_digest: OwnerDigest | None = (
            OwnerDigest(config.owner_secret) if config.owner_secret is not None else None
        )

    # --- what a back end provides ---------------------------------------------------------------
    @property
    @abstractmethod
    def location(self) -> str:
        """Where the data lives, for messages (no password)."""

    @abstractmethod
    async def _open(self) -> None:
        """Set up the connections (called once, before the migrations)."""

    @abstractmethod
    async def _close(self) -> None: ...

    @abstractmethod
    def _transaction(self, write: bool) -> contextlib.AbstractAsyncContextManager[Transaction]:
        """A connection; with ``write``, inside a transaction committed at exit (rolled back on
        an error; a connection left in an unknown state by a cancellation is never reused).
        Exclusion against other processes comes from :meth:`_lock`."""

    @abstractmethod
    async def _lock(self, tx: Transaction, lock: Lock) -> None:
        """Hold ``lock`` until ``tx`` ends, against every process over the database: ``migrate``
        (schema changes) or ``admit`` (count-then-insert of a registration)."""

    @abstractmethod
    def _is_unavailable(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the database cannot answer now (down, unreachable, locked)."""

    # --- life cycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and bring the schema up to date (VoiceStoreUnavailableError when the database
        cannot be reached: the library stays usable and retries at the next operation)."""
        await self._run("starting", self._noop)

    async def close(self) -> None:
        """Close the connections (bounded by ``timeout_s``); later operations are refused."""
        self._closed = True
        if self._opened:
            self._opened = False
            await self._close()

    async def __aenter__(self) -> VoiceLibrary:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    async def _noop() -> None:
        return None

    async def _ensure_started(self) -> None:
        if self._closed:
            raise VoiceStoreUnavailableError(
                f"voice store {self.location} is closed", retry_after_s=self.config.retry_after_s
            )
        if self._ready:
            return
        async with self._start_lock:
            if not self._opened:
                await self._open()
                self._opened = True
            if not self._ready:  # a failed attempt is retried by the next operation
                await self._migrate()
                self._ready = True

    async def _migrate(self) -> None:
        async with self._transaction(write=True) as tx:
            await self._lock(tx, "migrate")
            secret = await apply_migrations(tx, self.dialect, self.location)
        if self._owner_digest is None:
            self._owner_digest = OwnerDigest(bytes.fromhex(secret))

    async def _run(self, what: str, op: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """``op`` under the timeout, the back end's failures as VoiceStoreUnavailableError."""
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._ensure_started()
                return await op()
        except TTSError:
            raise
        except TimeoutError as exc:
            raise self._unavailable(what, f"no answer within {timeout:g} s") from exc
        except Exception as exc:
            if not self._is_unavailable(exc):
                raise
            raise self._unavailable(what, f"{type(exc).__name__}: {exc}") from exc

    def _unavailable(self, what: str, why: str) -> VoiceStoreUnavailableError:
        logger.warning("voice store %s unavailable (%s): %s", self.location, what, why)
        return VoiceStoreUnavailableError(
            f"voice store unavailable ({what}: {why})", retry_after_s=self.config.retry_after_s
        )

    # --- identity -------------------------------------------------------------------------------
    async def owner_digest(self) -> OwnerDigest:
        """The digest turning API keys into owners (the configured secret, else the database's)."""
        await self.start()
        assert self._owner_digest is not None
        return self._owner_digest

    async def scope_of(self, caller: Caller) -> Scope:
        """The scope of a call: anonymous without API keys (no database access), else its key's
        owner digest, admin or not (reading the database's secret, once, when none is
        configured: VoiceStoreUnavailableError while the database cannot answer)."""
        if caller.api_key is None:
            return Scope(admin=caller.admin)
        digest = await self.owner_digest()
        return digest.scope_of(caller.api_key, admin=caller.admin)

    async def schema_version(self) -> int:
        """The newest schema version applied to the database."""

        async def op() -> int:
            async with self._transaction(write=False) as tx:
                row = await tx.fetchrow("SELECT MAX(version) AS version FROM schema_migrations")
            return int(row["version"]) if row else 0

        return await self._run("reading the schema version", op)

    async def ping(self) -> None:
        """Raise VoiceStoreUnavailableError unless the database answers (a readiness check)."""

        async def op() -> None:
            async with self._transaction(write=False) as tx:
                await tx.fetchrow("SELECT 1 AS one")

        await self._run("checking the database", op)

    # --- registration ---------------------------------------------------------------------------
    async def add(self, voice: NewVoice, scope: Scope) -> VoiceRecord:
        """Store a new voice owned by ``scope.owner``: CapacityError past ``max_voices`` or the
        owner's quota, AlreadyExistsError when ``voice.voice_id`` is taken, InvalidRequestError for
        a bad field. Returns the stored record once it is durable."""
        checked = check_new_voice(voice)
        return await self._run(
            "registering a voice", lambda: self._insert(checked, scope, "register", keep_id_if_free=False)
        )

    async def import_document(self, document: Any, scope: Scope) -> VoiceRecord:
        """Store the voice of an export document (:mod:`.documents`) owned by ``scope.owner``: its id
        is kept when free (else a fresh one), quotas apply as to :meth:`add`."""
        checked = check_new_voice(parse_document(document))
        return await self._run(
            "importing a voice", lambda: self._insert(checked, scope, "import", keep_id_if_free=True)
        )

    async def check_capacity(self, scope: Scope) -> None:
        """CapacityError if :meth:`add` would refuse a voice of ``scope.owner`` now (a cheap early
        answer, before a registration's costly part; :meth:`add` checks again under its lock)."""

        async def op() -> None:
            async with self._transaction(write=False) as tx:
                await self._admit(tx, scope.owner)

        await self._run("checking the voice limits", op)

    async def _admit(self, tx: Transaction, owner: str) -> None:
        row = await tx.fetchrow(
            "SELECT COUNT(*) AS total, COALESCE(SUM(CASE WHEN owner = $1 THEN 1 ELSE 0 END), 0) AS mine "
            "FROM voices",
            owner,
        )
        assert row is not None
        if int(row["total"]) >= self.config.max_voices:
            raise CapacityError(
                f"voice limit reached ({self.config.max_voices} registered voices); delete some first"
            )
        quota = self.config.max_voices_per_owner
        if quota is not None and int(row["mine"]) >= quota:
            raise CapacityError(f"voice quota reached ({quota} voices for this API key); delete some first")

    async def _insert(
        self, voice: NewVoice, scope: Scope, action: str, *, keep_id_if_free: bool
    ) -> VoiceRecord:
        async with self._transaction(write=True) as tx:
            await self._lock(tx, "admit")
            await self._admit(tx, scope.owner)
            voice_id = voice.voice_id or new_voice_id()
            if voice.voice_id is not None and await voice_exists(tx, voice_id):
                if not keep_id_if_free:
                    raise AlreadyExistsError(f"voice_id {voice_id!r} is taken")
                voice_id = new_voice_id()
            record = await insert_voice(tx, voice, voice_id, scope.owner)
            await append_audit(
                tx, scope, action, voice_id, {"name": voice.name, "model_family": voice.model_family}
            )
        return record

    # --- lookups --------------------------------------------------------------------------------
    async def get(self, voice_id: str, scope: Scope) -> VoiceRecord:
        """The voice ``voice_id`` with its embedding and codes; NotFoundError when unknown or
        another owner's (outside the admin scope), so ids do not leak."""
        if not VOICE_ID_PATTERN.match(voice_id):
            raise _not_found(voice_id)

        async def op() -> VoiceRecord:
            async with self._transaction(write=False) as tx:
                row = await tx.fetchrow(f"SELECT {RECORD_COLUMNS} FROM voices WHERE voice_id = $1", voice_id)
            if row is None or not scope.sees(row["owner"]):
                raise _not_found(voice_id)
            return record_from_row(row)

        return await self._run("reading a voice", op)

    def _where(
        self, scope: Scope, model_family: str | Sequence[str] | None, owner: str | None, args: list[Any]
    ) -> list[str]:
        conditions: list[str] = []
        if not scope.admin:
            owner = scope.owner
        if owner is not None:
            args.append(owner)
            conditions.append(f"owner = ${len(args)}")
        if model_family is not None:
            families = [model_family] if isinstance(model_family, str) else list(dict.fromkeys(model_family))
            if not families:
                conditions.append("1 = 0")
            places = []
            for family in families:
                args.append(family)
                places.append(f"${len(args)}")
            if places:
                conditions.append(f"model_family IN ({', '.join(places)})")
        return conditions

    async def list_voices(
        self,
        scope: Scope,
        *,
        model_family: str | Sequence[str] | None = None,
        owner: str | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> VoicePage:
        """The voices visible in ``scope`` (the admin may narrow to one ``owner``), of
        ``model_family`` if given (one, or any of several), oldest first (then by id),
        ``page_size`` (1-1000) at a time; pass ``next_page_token`` back for the next page."""
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidRequestError(f"page_size must be 1 to {MAX_PAGE_SIZE}")
        args: list[Any] = []
        conditions = self._where(scope, model_family, owner, args)
        after = position_of(page_token)
        if after is not None:
            args.extend(after)
            conditions.append(
                f"(created_us > ${len(args) - 1} OR (created_us = ${len(args) - 1} AND voice_id > ${len(args)}))"
            )
        args.append(page_size + 1)
        where = f"WHERE {' AND '.join(conditions)} " if conditions else ""
        sql = f"SELECT {INFO_COLUMNS} FROM voices {where}ORDER BY created_us, voice_id LIMIT ${len(args)}"

        async def op() -> VoicePage:
            async with self._transaction(write=False) as tx:
                rows = await tx.fetch(sql, *args)
            voices = tuple(info_from_row(row) for row in rows[:page_size])
            more = len(rows) > page_size
            return VoicePage(voices, token_after(voices[-1]) if more else "")

        return await self._run("listing voices", op)

    async def iter_voices(
        self, scope: Scope, *, model_family: str | Sequence[str] | None = None, owner: str | None = None
    ) -> AsyncIterator[VoiceInfo]:
        """Every voice of :meth:`list_voices`, page after page."""
        token = ""
        while True:
            page = await self.list_voices(
                scope, model_family=model_family, owner=owner, page_size=MAX_PAGE_SIZE, page_token=token
            )
            for info in page.voices:
                yield info
            if not page.next_page_token:
                return
            token = page.next_page_token

    async def count(
        self, scope: Scope, *, model_family: str | Sequence[str] | None = None, owner: str | None = None
    ) -> int:
        """How many voices :meth:`list_voices` would give."""
        args: list[Any] = []
        conditions = self._where(scope, model_family, owner, args)
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""

        async def op() -> int:
            async with self._transaction(write=False) as tx:
                row = await tx.fetchrow(f"SELECT COUNT(*) AS n FROM voices{where}", *args)
            return int(row["n"]) if row else 0

        return await self._run("counting voices", op)

    # --- changes --------------------------------------------------------------------------------
    def _visible(self, scope: Scope, args: list[Any]) -> str:
        if scope.admin:
            return ""
        args.append(scope.owner)
        return f" AND owner = ${len(args)}"

    async def update(self, voice_id: str, patch: VoicePatch, scope: Scope) -> VoiceInfo:
        """Apply a PATCH (rename, relabel, describe); NotFoundError as :meth:`get`."""
        patch = check_patch(patch)
        if not VOICE_ID_PATTERN.match(voice_id):
            raise _not_found(voice_id)
        changed = patch.changed_fields()
        args: list[Any] = [voice_id]
        owned = self._visible(scope, args)
        sets = []
        for name in changed:
            value = getattr(patch, name)
            args.append(labels_json(value) if name == "labels" else value)
            sets.append(f"{name} = ${len(args)}")
        args.append(now_us())
        sets.append(f"updated_us = ${len(args)}")

        async def op() -> VoiceInfo:
            async with self._transaction(write=True) as tx:
                if not changed:
                    row = await tx.fetchrow(
                        f"SELECT {INFO_COLUMNS} FROM voices WHERE voice_id = $1{owned}", *args[:-1]
                    )
                else:
                    row = await tx.fetchrow(
                        f"UPDATE voices SET {', '.join(sets)} WHERE voice_id = $1{owned} RETURNING {INFO_COLUMNS}",
                        *args,
                    )
                if row is None:
                    raise _not_found(voice_id)
                if changed:
                    await append_audit(
                        tx, scope, "update", voice_id, {"changed": changed, "name": row["name"]}
                    )
            return info_from_row(row)

        return await self._run("updating a voice", op)

    async def delete(self, voice_id: str, scope: Scope) -> VoiceInfo:
        """Remove a voice (embedding and codes with it); NotFoundError as :meth:`get`. Returns what
        it was."""
        if not VOICE_ID_PATTERN.match(voice_id):
            raise _not_found(voice_id)
        args: list[Any] = [voice_id]
        owned = self._visible(scope, args)

        async def op() -> VoiceInfo:
            async with self._transaction(write=True) as tx:
                row = await tx.fetchrow(
                    f"DELETE FROM voices WHERE voice_id = $1{owned} RETURNING {INFO_COLUMNS}", *args
                )
                if row is None:
                    raise _not_found(voice_id)
                await append_audit(
                    tx, scope, "delete", voice_id, {"name": row["name"], "owner": row["owner"]}
                )
            return info_from_row(row)

        return await self._run("deleting a voice", op)

    async def export(self, voice_id: str, scope: Scope) -> dict[str, Any]:
        """The export document of a voice (embedding, codes, transcript, metadata); audited.
        NotFoundError as :meth:`get`."""
        if not VOICE_ID_PATTERN.match(voice_id):
            raise _not_found(voice_id)
        args: list[Any] = [voice_id]
        owned = self._visible(scope, args)

        async def op() -> dict[str, Any]:
            async with self._transaction(write=True) as tx:
                row = await tx.fetchrow(
                    f"SELECT {RECORD_COLUMNS} FROM voices WHERE voice_id = $1{owned}", *args
                )
                if row is None:
                    raise _not_found(voice_id)
                await append_audit(tx, scope, "export", voice_id, {"name": row["name"]})
            return export_document(record_from_row(row))

        return await self._run("exporting a voice", op)

    # --- audit ----------------------------------------------------------------------------------
    async def audit_trail(
        self, scope: Scope, *, voice_id: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> list[AuditEntry]:
        """Audit entries in order (after ``after_seq``): every actor's for the admin, else the
        caller's own."""
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidRequestError(f"limit must be 1 to {MAX_PAGE_SIZE}")
        args: list[Any] = [after_seq]
        conditions = ["seq > $1"]
        if not scope.admin:
            args.append(scope.owner)
            conditions.append(f"actor = ${len(args)}")
        if voice_id is not None:
            args.append(voice_id)
            conditions.append(f"voice_id = ${len(args)}")
        args.append(limit)
        sql = (
            "SELECT seq, at_us, actor, admin, action, voice_id, detail FROM voice_audit "
            f"WHERE {' AND '.join(conditions)} ORDER BY seq LIMIT ${len(args)}"
        )

        async def op() -> list[AuditEntry]:
            async with self._transaction(write=False) as tx:
                rows = await tx.fetch(sql, *args)
            return [
                AuditEntry(
                    seq=int(r["seq"]),
                    at=datetime_from_us(int(r["at_us"])),
                    actor=r["actor"],
                    admin=bool(r["admin"]),
                    action=r["action"],
                    voice_id=r["voice_id"],
                    detail=json.loads(r["detail"]),
                )
                for r in rows
            ]

        return await self._run("reading the audit trail", op)

    # --- legacy directory -----------------------------------------------------------------------
    async def import_legacy_directory(
        self,
        directory: str | os.PathLike[str],
        *,
        owner: str = "",
        model_family: str = "",
        consent: str = "",
        again: bool = False,
        timeout_s: float = 120.0,
    ) -> LegacyImport:
        """Import the voice files of a legacy ``--voices-dir`` (one JSON file per voice), once:
        the import is recorded under the directory's absolute path and later calls return
        ``already_done`` without reading it (``again`` imports it anew). All in one transaction;
        ids already in the library are left alone; unreadable files are skipped and logged.
        The voices get ``owner`` and ``consent`` (the legacy format has neither) and keep their
        file's ``family``; ``model_family`` is given to those without one (files older than
        model families). ``max_voices`` and quotas do not apply (those voices were admitted
        before)."""
        source = str(Path(directory).resolve())
        done_sql = "SELECT imported FROM legacy_imports WHERE source = $1"

        async def done() -> bool:
            async with self._transaction(write=False) as tx:
                return await tx.fetchrow(done_sql, source) is not None

        if not again and await self._run("reading the legacy imports", done):
            return LegacyImport(source, 0, 0, (), already_done=True)
        voices, skipped = await asyncio.to_thread(read_legacy_directory, Path(source))
        system = Scope(owner="", admin=True)

        async def op() -> LegacyImport:
            async with self._transaction(write=True) as tx:
                await self._lock(tx, "admit")
                if not again and await tx.fetchrow(done_sql, source) is not None:
                    return LegacyImport(source, 0, 0, (), already_done=True)
                imported = 0
                for voice in voices:
                    assert voice.voice_id is not None
                    if await voice_exists(tx, voice.voice_id):
                        continue
                    voice = replace(voice, model_family=voice.model_family or model_family, consent=consent)
                    await insert_voice(tx, voice, voice.voice_id, owner)
                    await append_audit(
                        tx, system, "legacy_import", voice.voice_id, {"name": voice.name, "source": source}
                    )
                    imported += 1
                await tx.execute(
                    "INSERT INTO legacy_imports (source, imported_us, imported, skipped) VALUES ($1, $2, $3, $4) "
                    "ON CONFLICT (source) DO UPDATE SET imported_us = $2, imported = $3, skipped = $4",
                    source,
                    now_us(),
                    imported,
                    len(skipped),
                )
            logger.info(
                "voice library %s: imported %d voice(s) from %s (%d already present, %d unreadable file(s))",
                self.location,
                imported,
                source,
                len(voices) - imported,
                len(skipped),
            )
            return LegacyImport(source, imported, len(voices) - imported, tuple(skipped))

        return await self._run("importing the legacy voices directory", op, timeout_s)


__all__ = ["LegacyImport", "MAX_PAGE_SIZE", "VoiceLibrary"]
