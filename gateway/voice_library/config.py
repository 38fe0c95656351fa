"""The voice library's settings (:class:`VoiceLibraryConfig`), for both back ends."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class VoiceLibraryConfig:
    """Limits, timeouts and connection settings of a :class:`VoiceLibrary`."""

    max_voices: int = 1000
    """Most voices in the library, all owners together (the gateway's ``--max-voices``);
    registering beyond it fails with CapacityError (RESOURCE_EXHAUSTED)."""

    max_voices_per_owner: int | None = None
    """Most voices one owner (API key) may hold; None: only ``max_voices`` applies."""

    timeout_s: float = 5.0
    """Limit of every operation (waiting for a connection or a lock included); past it the
    operation fails with VoiceStoreUnavailableError (UNAVAILABLE) instead of hanging."""

    retry_after_s: float = 1.0
    """The retry hint carried by VoiceStoreUnavailableError."""

    pool_size: int = 4
    """Most database connections of this library (each SQLite connection is a thread)."""

    owner_secret: bytes | None = None
    """Server secret of the owner digest (HMAC-SHA256 of API keys), at least 16 bytes; None: a
    random secret generated once and kept in the database (shared by every replica over it)."""

    postgres_schema: str = "public"
    """PostgreSQL schema holding the library's tables (created if missing)."""

    def __post_init__(self) -> None:
        if self.max_voices < 1:
            raise ValueError("max_voices must be at least 1")
        if self.max_voices_per_owner is not None and self.max_voices_per_owner < 1:
            raise ValueError("max_voices_per_owner must be at least 1 (or None)")
        if not self.timeout_s > 0 or not self.retry_after_s > 0:
            raise ValueError("timeout_s and retry_after_s must be positive")
        if self.pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if self.owner_secret is not None and len(self.owner_secret) < 16:
            raise ValueError("owner_secret needs at least 16 bytes")
        if not _SCHEMA_NAME.match(self.postgres_schema):
            raise ValueError(f"postgres_schema {self.postgres_schema!r}: use [a-z_][a-z0-9_]*")


__all__ = ["VoiceLibraryConfig"]
