"""The embedded back end: one SQLite file in WAL mode through aiosqlite (each connection a thread).

Durability and sharing: ``synchronous=FULL`` (a committed registration survives a power cut),
WAL (readers never wait for the writer), writes in ``BEGIN IMMEDIATE`` transactions (SQLite's one
write lock serialises registrations, so count-then-insert cannot race, across processes too).
Several gateways may share the file only on one host (SQLite's locks do not work over network
file systems): use PostgreSQL for replicas on several hosts.

No cache: every lookup reads the file (tens of microseconds; see ``bench/voice_store.py``), so a
change through any connection or process is seen by the next read. A connection whose operation
timed out or was cancelled is interrupted and closed (closing rolls back what it had not
committed), never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from .config import VoiceLibraryConfig
from .library import VoiceLibrary
from .sql import Lock, Transaction

MIN_SQLITE_VERSION = (3, 37, 0)
"""STRICT tables (3.37), RETURNING (3.35), upsert (3.24)."""

_NOT_UNAVAILABLE = (
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
)


@functools.lru_cache(maxsize=256)
def _sqlite_placeholders(sql: str) -> str:
    """``$1`` (the library's placeholders) as SQLite's numbered ``?1``."""
    return re.sub(r"\$(\d+)", r"?\1", sql)


class _SqliteTransaction(Transaction):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: Any) -> None:
        await self._conn.execute_fetchall(_sqlite_placeholders(sql), args)

    async def fetch(self, sql: str, *args: Any) -> Sequence[Mapping[str, Any]]:
        return list(await self._conn.execute_fetchall(_sqlite_placeholders(sql), args))

    async def fetchrow(self, sql: str, *args: Any) -> Mapping[str, Any] | None:
        rows = await self._conn.execute_fetchall(_sqlite_placeholders(sql), args)
        return next(iter(rows), None)


class _ConnectionPool:
    """At most ``size`` connections; idle ones are reused, broken ones closed in the background."""

    def __init__(self, path: Path, size: int, busy_timeout_s: float) -> None:
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._slots = asyncio.Semaphore(size)
        self._idle: list[aiosqlite.Connection] = []
        self._closing: set[asyncio.Task[None]] = set()

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self._path, isolation_level=None, timeout=self._busy_timeout_s)
        try:
            conn.row_factory = sqlite3.Row
            await conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            await self._use_wal(conn)
            await conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            self.discard(conn)
            raise
        return conn

    async def _use_wal(self, conn: aiosqlite.Connection) -> None:
        """Switch the file to WAL (persistent: once per file), retrying while another holds a lock.

        SQLite answers a journal-mode change it cannot lock for at once with "database is locked",
        without calling the busy handler, so gateways starting together on a new file would fail
        here; retry for as long as the busy timeout allows instead.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._busy_timeout_s
        delay_s = 0.005
        while True:
            try:
                rows = await conn.execute_fetchall("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise
                failure = exc
            else:
                # A change that could not be made answers the mode in force instead of an error.
                mode = str(next(iter(rows))[0]).lower() if rows else ""
                if mode == "wal":
                    return
                failure = sqlite3.OperationalError(f"the voice store cannot use WAL (journal mode {mode!r})")
            if loop.time() + delay_s > deadline:
                raise failure
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.1)

    async def acquire(self) -> aiosqlite.Connection:
        await self._slots.acquire()
        try:
            return self._idle.pop() if self._idle else await self._connect()
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: aiosqlite.Connection) -> None:
        self._idle.append(conn)
        self._slots.release()

    def discard(self, conn: aiosqlite.Connection, *, holds_slot: bool = False) -> None:
        """Close ``conn`` without waiting: interrupt what it runs; closing rolls back."""
        if holds_slot:
            self._slots.release()
        # sqlite3's interrupt() is thread-safe and stops the statement the connection's thread is
        # stuck in (waiting for a lock, say); aiosqlite's own would queue behind that statement.
        with contextlib.suppress(ValueError, sqlite3.Error):  # not open (any more)
            conn._conn.interrupt()
        task = asyncio.get_running_loop().create_task(self._close(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(conn: aiosqlite.Connection) -> None:
        with contextlib.suppress(sqlite3.Error, ValueError):
            await conn.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


class SqliteVoiceLibrary(VoiceLibrary):
    """The voice library in one SQLite file (the embedded default)."""

    dialect = "sqlite"

    def __init__(self, path: str | Path, config: VoiceLibraryConfig) -> None:
        super().__init__(config)
        self.path = Path(path)
        self._pool: _ConnectionPool | None = None

    @property
    def location(self) -> str:
        return f"sqlite:{self.path}"

    async def _open(self) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise RuntimeError(
                f"SQLite {sqlite3.sqlite_version} is too old for the voice library (needs "
                f"{'.'.join(map(str, MIN_SQLITE_VERSION))})"
            )
        await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
        self._pool = _ConnectionPool(self.path, self.config.pool_size, self.config.timeout_s)

    async def _close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    @contextlib.asynccontextmanager
    async def _transaction(self, write: bool) -> AsyncIterator[Transaction]:
        assert self._pool is not None
        conn = await self._pool.acquire()
        clean = False
        try:
            if write:
                await conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTransaction(conn)
            except Exception:
                if write:
                    await conn.execute("ROLLBACK")
                clean = True
                raise
            if write:
                await conn.execute("COMMIT")
            clean = True
        finally:
            if clean:
                self._pool.release(conn)
            else:  # cancelled (timeout) or the database failed mid-way: never reuse it
                self._pool.discard(conn, holds_slot=True)

    async def _lock(self, tx: Transaction, lock: Lock) -> None:
        """Nothing to add: ``BEGIN IMMEDIATE`` took SQLite's one write lock."""

    def _is_unavailable(self, exc: BaseException) -> bool:
        return isinstance(exc, (sqlite3.OperationalError, sqlite3.DatabaseError, OSError)) and not isinstance(
            exc, _NOT_UNAVAILABLE
        )


__all__ = ["MIN_SQLITE_VERSION", "SqliteVoiceLibrary"]
