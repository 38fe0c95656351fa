"""The voice-library tests run against both back ends through one fixture, :func:`backend`:
SQLite in a temporary directory, and PostgreSQL on the machine's shared server in a schema of the
test's own (dropped afterwards; skipped, saying why, only where no server answers)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.voice_library import VoiceLibrary, VoiceLibraryConfig, create_voice_library
from tests.helpers.postgres import (
    drop_schema,
    new_schema_name,
    shared_postgres_unreachable,
    shared_postgres_url,
)


@dataclass(frozen=True)
class Backend:
    """One database both back ends' tests open libraries over (several at once, like replicas)."""

    name: str
    target: str
    schema: str = "public"

    def config(self, **settings: Any) -> VoiceLibraryConfig:
        return VoiceLibraryConfig(postgres_schema=self.schema, **settings)

    def library(self, **settings: Any) -> VoiceLibrary:
        """A new library (another 'replica') over this database."""
        return create_voice_library(self.target, self.config(**settings))

    async def raw(self, statement: str) -> list[tuple[Any, ...]]:
        """Run one statement on the database directly (not through a library); its rows. The
        driver's errors propagate (sqlite3.Error, asyncpg.PostgresError)."""
        if self.name == "sqlite":
            conn = sqlite3.connect(self.target, isolation_level=None)
            try:
                return conn.execute(statement).fetchall()
            finally:
                conn.close()
        import asyncpg

        pg = await asyncpg.connect(self.target, server_settings={"search_path": self.schema})
        try:
            return [tuple(row) for row in await pg.fetch(statement)]
        finally:
            await pg.close()


def postgres_backend() -> Iterator[Backend]:
    reason = shared_postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    url = shared_postgres_url()
    schema = new_schema_name()
    try:
        yield Backend("postgresql", url, schema)
    finally:
        asyncio.run(drop_schema(url, schema))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", str(tmp_path / "voices.db"))
    else:
        yield from postgres_backend()
