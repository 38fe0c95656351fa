"""API-key authentication of the public API: :class:`ApiKeys` (the decision, shared by gRPC and
HTTP), :class:`ApiKeyInterceptor` (the gRPC port) and :class:`Callers` (whose call it is, for
the voice library: the key and whether it is an admin key).

A call must carry ``authorization: Bearer KEY`` or ``x-api-key: KEY`` (gRPC metadata or HTTP
headers). Missing key: UNAUTHENTICATED (HTTP 401); a key not in the configured set:
PERMISSION_DENIED (HTTP 403). Health and reflection stay open (load balancers and grpcurl ``list``
need no key). Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Sequence

import grpc

from tts_common import metrics
from tts_common.errors import PermissionDeniedError, UnauthenticatedError
from tts_common.serving.interceptors import RefusingInterceptor
from tts_common.serving.names import PLUMBING_METHOD_PREFIXES

from ..voice_library import NO_KEYS, Caller

logger = logging.getLogger(__name__)

OPEN_METHOD_PREFIXES: tuple[str, ...] = PLUMBING_METHOD_PREFIXES
"""Methods callable without a key (health and reflection)."""


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def extract_api_key(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The key presented in call metadata (``authorization: Bearer`` first), or None."""
    bearer = api_key = None
    for key, value in metadata or ():
        name = key.lower()
        if name == "authorization":
            scheme, _, token = _text(value).strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
        elif name == "x-api-key" and _text(value).strip():
            api_key = _text(value).strip()
    return bearer or api_key


class ApiKeys:
    """The accepted API keys and the one decision about a presented one."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(k.encode("utf-8") for k in keys if k)
        if not self._keys:
            raise ValueError("ApiKeys needs at least one key")

    def is_valid(self, key: str) -> bool:
        """Whether ``key`` is one of the configured keys (constant time per key)."""
        candidate = key.encode("utf-8")
        valid = False
        for known in self._keys:
            valid |= hmac.compare_digest(candidate, known)
        return valid

    def authenticate(
        self, metadata: Iterable[tuple[str, str | bytes]] | None, where: str = "metadata"
    ) -> None:
        """Accept the call or raise :class:`UnauthenticatedError` (no key) /
        :class:`PermissionDeniedError` (unknown key). ``metadata``: gRPC call metadata or HTTP
        headers as (lower-case name, value) pairs; ``where`` names them in the message."""
        key = extract_api_key(metadata)
        if key is None:
            raise UnauthenticatedError(
                f"missing API key: send 'authorization: Bearer KEY' or 'x-api-key: KEY' {where}"
            )
        if not self.is_valid(key):
            raise PermissionDeniedError("invalid API key")


class ApiKeyInterceptor(RefusingInterceptor):
    """Rejects gRPC calls without a valid API key (see the module doc)."""

    def __init__(
        self,
        keys: Iterable[str],
        *,
        stage: str = "gateway",
        open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES,
    ) -> None:
        super().__init__(open_prefixes)
        self.keys = ApiKeys(keys)
        self._stage = stage

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        try:
            self.keys.authenticate(details.invocation_metadata)
        except (UnauthenticatedError, PermissionDeniedError) as exc:
            code = grpc.StatusCode[exc.grpc_status]
            logger.info("rejected %s: %s", details.method, code.name)
            metrics.REQUESTS.labels(stage=self._stage, status=code.name).inc()
            return code, str(exc)
        return None


class Callers:
    """Who makes a call, from its metadata or headers (after authentication): the key
    :func:`extract_api_key` finds and whether it is one of the admin keys; without API keys every
    call is the anonymous :data:`~gateway.voice_library.NO_KEYS`."""

    def __init__(self, api_keys: Iterable[str], admin_keys: Iterable[str] = ()) -> None:
        self.enabled = any(api_keys)
        admin = [k for k in admin_keys if k]
        self._admin = ApiKeys(admin) if admin else None

    def of(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Caller:
        """The caller of a call with ``metadata`` (gRPC call metadata or HTTP headers)."""
        if not self.enabled:
            return NO_KEYS
        key = extract_api_key(metadata)
        if key is None:  # authentication refuses such calls first; never the anonymous owner
            raise UnauthenticatedError("missing API key")
        return Caller(key, admin=self._admin is not None and self._admin.is_valid(key))


__all__ = ["ApiKeyInterceptor", "ApiKeys", "Callers", "OPEN_METHOD_PREFIXES", "extract_api_key"]
