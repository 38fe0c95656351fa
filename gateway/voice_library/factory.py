"""One entry point from a database location to a voice library: :func:`create_voice_library`."""

from __future__ import annotations

import os
from pathlib import Path

from .config import VoiceLibraryConfig
from .library import VoiceLibrary
from .postgres import PostgresVoiceLibrary
from .sqlite import SqliteVoiceLibrary

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def create_voice_library(
    target: str | os.PathLike[str], config: VoiceLibraryConfig | None = None
) -> VoiceLibrary:
    """The library at ``target`` (not connected yet: ``await library.start()``):

    * ``postgresql://user:password@host:5432/db`` (or ``postgres://``): PostgreSQL, the tables in
      ``config.postgres_schema``; libpq-style query parameters (``sslmode``, ...) are understood;
    * ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path: SQLite.
    """
    config = config or VoiceLibraryConfig()
    text = os.fspath(target)
    if text.startswith(POSTGRES_SCHEMES):
        return PostgresVoiceLibrary(text, config)
    if text.startswith("sqlite://"):
        path = text[len("sqlite://") :]
        if not path.startswith("/") or path == "/":
            raise ValueError(
                f"voice database {text!r}: write sqlite:///relative.db or sqlite:////absolute.db"
            )
        text = path[1:]
    elif "://" in text:
        raise ValueError(f"voice database {text!r}: use a path, sqlite:///PATH or postgresql://...")
    if not text or text == ":memory:":
        raise ValueError("the voice database needs a file (several connections share it)")
    return SqliteVoiceLibrary(Path(text), config)


__all__ = ["create_voice_library"]
