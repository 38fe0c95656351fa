"""A database that is locked, slow, unreachable or absent gives VoiceStoreUnavailableError
(UNAVAILABLE, with a retry hint) within the operation's timeout, never a hang; and the library
works again once the database does, without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway.voice_library import ANONYMOUS, VoiceStoreUnavailableError, create_voice_library
from gateway.voice_library.config import VoiceLibraryConfig
from tests.helpers.fake_stages import run
from tests.helpers.postgres import (
    drop_schema,
    new_schema_name,
    shared_postgres_unreachable,
    shared_postgres_url,
)
from tests.helpers.stack import free_port
from tts_common.serving.rpc_errors import grpc_status_for

from .conftest import Backend
from .test_library import ALICE, make_voice

TIMEOUT_S = 0.5
HANG_GUARD_S = TIMEOUT_S + 4.0
"""Generous bound on how long a failing operation may take (the point: it does not hang)."""


async def unavailable_in_time(operation: Awaitable[Any]) -> VoiceStoreUnavailableError:
    started = time.monotonic()
    with pytest.raises(VoiceStoreUnavailableError) as caught:
        await operation
    assert time.monotonic() - started < HANG_GUARD_S
    error = caught.value
    assert grpc_status_for(error) == grpc.StatusCode.UNAVAILABLE
    assert error.retry_after_s == 1.0 and str(error).endswith("retry in 1 s")
    return error


@contextlib.asynccontextmanager
async def database_locked(backend: Backend) -> AsyncIterator[None]:
    """Another client holds the voices table (PostgreSQL: ACCESS EXCLUSIVE, reads wait too;
    SQLite: the write lock, writes wait)."""
    if backend.name == "sqlite":
        conn = sqlite3.connect(backend.target, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    import asyncpg

    conn = await asyncpg.connect(backend.target, server_settings={"search_path": backend.schema})
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE voices IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


def test_a_locked_database_is_unavailable_within_the_timeout_then_recovers(backend: Backend) -> None:
    async def main() -> None:
        async with backend.library(timeout_s=TIMEOUT_S) as library:
            voice = await library.add(make_voice(1), ALICE)
            async with database_locked(backend):
                error = await unavailable_in_time(library.add(make_voice(2), ALICE))
                assert f"no answer within {TIMEOUT_S:g} s" in str(error) and "registering a voice" in str(
                    error
                )
                await unavailable_in_time(library.delete(voice.voice_id, ALICE))
                if backend.name == "postgresql":
                    await unavailable_in_time(library.get(voice.voice_id, ALICE))
                else:  # WAL: readers never wait for the writer
                    assert await library.get(voice.voice_id, ALICE) == voice
            # the same library works again: no connection stuck in the failed operations
            for i in range(3, 3 + 2 * library.config.pool_size):
                await library.add(make_voice(i), ALICE)
            assert await library.count(ALICE) == 1 + 2 * library.config.pool_size

    run(main())


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def tcp_server(port: int, upstream: tuple[str, int] | None) -> AsyncIterator[None]:
    """On ``port``: a proxy to ``upstream``, or (None) a server that accepts and never answers."""
    silent: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if upstream is None:
            silent.append(writer)
            return
        up_reader, up_writer = await asyncio.open_connection(*upstream)
        await asyncio.gather(_forward(reader, up_writer), _forward(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for writer in silent:
            writer.close()
        server.close_clients() if hasattr(server, "close_clients") else None  # Python >= 3.13


def test_postgres_down_slow_then_back(tmp_path: Path) -> None:
    """Nothing listening, then a server that never answers, then the real one behind a proxy on
    the same port: UNAVAILABLE in time for the first two, and the same library serves once the
    database does (it was never restarted)."""
    reason = shared_postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    real = shared_postgres_url()
    schema = new_schema_name()
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/{real.rsplit('/', 1)[1]}"

    async def main() -> None:
        library = create_voice_library(url, VoiceLibraryConfig(postgres_schema=schema, timeout_s=TIMEOUT_S))
        try:
            error = await unavailable_in_time(library.start())  # nothing listens
            assert "starting" in str(error)
            await unavailable_in_time(library.get("voice-" + "0" * 32, ANONYMOUS))
            async with tcp_server(port, None):  # accepts, never answers
                error = await unavailable_in_time(library.add(make_voice(1), ALICE))
                assert f"no answer within {TIMEOUT_S:g} s" in str(error)
            async with tcp_server(port, ("127.0.0.1", 5432)):
                voice = await library.add(make_voice(1), ALICE)
                assert await library.get(voice.voice_id, ALICE) == voice
        finally:
            await library.close()
            await drop_schema(real, schema)

    if not real.startswith("postgresql://postgres@127.0.0.1:5432/"):
        pytest.skip("the proxy step forwards to 127.0.0.1:5432; QWEN3TTS_TEST_POSTGRES_URL points elsewhere")
    run(main())


def test_sqlite_file_that_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "not-a-directory").write_text("")

    async def main() -> None:
        library = create_voice_library(
            tmp_path / "not-a-directory" / "voices.db", VoiceLibraryConfig(timeout_s=TIMEOUT_S)
        )
        await unavailable_in_time(library.start())
        await unavailable_in_time(library.add(make_voice(1), ALICE))
        await library.close()
        await unavailable_in_time(library.count(ALICE))  # closed: refused, not reopened

    run(main())


def test_sqlite_gateways_starting_together_on_a_new_file_all_start(tmp_path: Path) -> None:
    """Several connections switching one new file to WAL at once: SQLite answers some of them
    "database is locked" at once, without waiting on its busy timeout (before the switch was
    retried, four runs in four of this test failed); every library must start."""
    trials = 100

    async def main() -> None:
        for trial in range(trials):
            libraries = [
                create_voice_library(tmp_path / f"voices-{trial}.db", VoiceLibraryConfig(timeout_s=5.0))
                for _ in range(4)
            ]
            try:
                await asyncio.gather(*(library.start() for library in libraries))
            finally:
                for library in libraries:
                    await library.close()

    run(main())
    for trial in range(trials):
        with contextlib.closing(sqlite3.connect(tmp_path / f"voices-{trial}.db")) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_only_the_database_being_unavailable_is_unavailable() -> None:
    """Transient failures (connection lost, shutdown, locked, out of resources) become UNAVAILABLE;
    a broken statement or constraint stays what it is (an INTERNAL bug report, not a retry)."""
    import asyncpg

    postgres = create_voice_library("postgresql://db/x")
    sqlite = create_voice_library("voices.db")
    for exc in (
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.TooManyConnectionsError("too many clients"),
        asyncpg.exceptions.SerializationError("could not serialize"),
        asyncpg.exceptions.ReadOnlySQLTransactionError("read-only transaction"),
        asyncpg.InterfaceError("connection is closed"),
        ConnectionRefusedError(),
    ):
        assert postgres._is_unavailable(exc), exc
    for exc in (
        asyncpg.exceptions.UndefinedTableError("no such table"),
        asyncpg.exceptions.UniqueViolationError("duplicate key"),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        ValueError("bug"),
    ):
        assert not postgres._is_unavailable(exc), exc
    assert sqlite._is_unavailable(sqlite3.OperationalError("database is locked"))
    assert sqlite._is_unavailable(sqlite3.DatabaseError("database disk image is malformed"))
    assert not sqlite._is_unavailable(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not sqlite._is_unavailable(sqlite3.ProgrammingError("bug"))
