"""The shared back end: PostgreSQL through asyncpg's connection pool, for several gateways.

Consistency: no cache; every lookup is one indexed query on the primary, so a voice committed by
any gateway is seen by the next lookup of every other one, and a deletion likewise. Registrations
hold a transaction-scoped advisory lock for their count-then-insert (``max_voices`` and the
owner's quota hold across replicas); the schema migrations hold another, so gateways starting
together apply them once. Both locks are keyed by the schema, so libraries in different schemas
of one database do not wait for each other.

Durability: a write returns after PostgreSQL acknowledged its COMMIT (with the default
``synchronous_commit = on`` the commit record is flushed to the WAL first); a connection lost
before that answer raises, and the pool drops the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from .config import VoiceLibraryConfig
from .library import VoiceLibrary
from .sql import Lock, Transaction

LOCK_CLASS = {"migrate": 0x51335401, "admit": 0x51335402}
"""First key of the advisory locks (the second is ``hashtext(schema)``)."""

UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "3D", "53", "57", "58", "40"})
"""SQLSTATE classes meaning the database cannot serve now: connection exception, invalid
authorization, unknown database, insufficient resources, operator intervention (shutdown, query
canceled), system error, transaction rollback (serialisation failure, deadlock)."""

UNAVAILABLE_SQLSTATES = frozenset({"25006", "55P03"})
"""Read-only transaction (a standby after a failover), lock not available."""


def redact(dsn: str) -> str:
    """``dsn`` without its password (for messages and logs)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class _PostgresTransaction(Transaction):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: Any) -> None:
        await self._conn.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any) -> Sequence[Mapping[str, Any]]:
        return await self._conn.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Mapping[str, Any] | None:
        return await self._conn.fetchrow(sql, *args)


class PostgresVoiceLibrary(VoiceLibrary):
    """The voice library in a PostgreSQL database (``postgresql://user:password@host/db``)."""

    dialect = "postgresql"

    def __init__(self, dsn: str, config: VoiceLibraryConfig) -> None:
        super().__init__(config)
        self.dsn = dsn
        self.schema = config.postgres_schema
        self._pool: asyncpg.Pool | None = None

    @property
    def location(self) -> str:
        return f"{redact(self.dsn)} (schema {self.schema})"

    async def _open(self) -> None:
        # min_size 0: no connection at creation, so a database that is down does not stop the
        # gateway from starting; each operation connects as needed (bounded by its timeout).
        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=0,
            max_size=self.config.pool_size,
            timeout=self.config.timeout_s,
            server_settings={"search_path": self.schema, "application_name": "qwen3-tts-gateway"},
        )

    async def _close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:  # graceful, but never a hang at shutdown
                await asyncio.wait_for(pool.close(), self.config.timeout_s)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                pool.terminate()

    @contextlib.asynccontextmanager
    async def _transaction(self, write: bool) -> AsyncIterator[Transaction]:
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            if not write:
                yield _PostgresTransaction(conn)
                return
            async with conn.transaction():
                yield _PostgresTransaction(conn)

    async def _lock(self, tx: Transaction, lock: Lock) -> None:
        await tx.execute(
            "SELECT pg_advisory_xact_lock($1::int4, hashtext($2))", LOCK_CLASS[lock], self.schema
        )
        if lock == "migrate":
            await tx.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def _is_unavailable(self, exc: BaseException) -> bool:
        if isinstance(exc, asyncpg.PostgresError):
            state = exc.sqlstate or ""
            return (
                state[:2] in UNAVAILABLE_SQLSTATE_CLASSES
                or state in UNAVAILABLE_SQLSTATES
                or isinstance(exc, asyncpg.PostgresConnectionError)
            )
        if isinstance(exc, asyncpg.InterfaceError):
            # A connection closed under an operation ("connection is closed", "pool is closing").
            return "closed" in str(exc) or "closing" in str(exc)
        return isinstance(exc, (OSError, ssl.SSLError, ConnectionError, EOFError))


__all__ = ["LOCK_CLASS", "PostgresVoiceLibrary", "redact"]
