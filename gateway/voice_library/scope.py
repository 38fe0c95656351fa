"""Who is asking: :class:`Caller` (the API key a call presented, as the transports saw it),
:class:`Scope` (an owner, or the admin who sees every voice) and :class:`OwnerDigest` (an API key
to the owner stored with its voices).

Keys never reach the store in clear: a voice's owner is HMAC-SHA256(secret, key) in hex. The
secret is the server's (``VoiceLibraryConfig.owner_secret``), or, unset, a random one the library
generates once and keeps in its own database, so every replica over one database derives the same
owner from the same key. Without API keys every caller is the anonymous owner ``""``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

MIN_SECRET_BYTES = 16
"""Shortest accepted owner secret."""


class OwnerDigest:
    """The keyed digest of API keys (HMAC-SHA256 with the server secret)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the owner secret needs at least {MIN_SECRET_BYTES} bytes")
        self._secret = bytes(secret)

    def owner_of(self, api_key: str) -> str:
        """The owner recorded for voices registered with ``api_key`` (64 hex digits)."""
        return hmac.new(self._secret, api_key.encode("utf-8"), hashlib.sha256).hexdigest()

    def scope_of(self, api_key: str | None, *, admin: bool = False) -> Scope:
        """The scope of a call made with ``api_key`` (None: keys are off, the anonymous owner)."""
        return Scope(owner="" if api_key is None else self.owner_of(api_key), admin=admin)


@dataclass(frozen=True)
class Scope:
    """The caller's view of the library: its own voices, or every voice for the admin."""

    owner: str = ""
    """The caller's owner digest (``""``: keys are off); voices it adds belong to it."""

    admin: bool = False
    """Sees, updates, deletes and exports every owner's voices."""

    def sees(self, owner: str) -> bool:
        """Whether a voice of ``owner`` is visible in this scope."""
        return self.admin or owner == self.owner


ANONYMOUS = Scope()
"""The scope of every call when API keys are off."""


@dataclass(frozen=True)
class Caller:
    """Who makes a call, before the library turns it into a :class:`Scope`
    (:meth:`VoiceLibrary.scope_of`, which may need the database's secret): the transports know
    the key, only voice operations need its digest, so a call that touches no voice never waits
    for the database."""

    api_key: str | None = field(default=None, repr=False)
    """The API key the call presented; None when the gateway has no API keys (anonymous)."""

    admin: bool = False
    """The key is an admin key (sees and manages every owner's voices)."""


NO_KEYS = Caller()
"""The caller of every call when API keys are off."""

__all__ = ["ANONYMOUS", "Caller", "MIN_SECRET_BYTES", "NO_KEYS", "OwnerDigest", "Scope"]
