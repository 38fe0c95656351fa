"""API-key authentication of the public port (a grpc.aio server interceptor).

A call must carry ``authorization: Bearer KEY`` or ``x-api-key: KEY`` metadata. Missing key:
UNAUTHENTICATED; a key not in the configured set: PERMISSION_DENIED. Health and reflection stay
open (load balancers and grpcurl ``list`` need no key). Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Sequence

import grpc

from tts_common import metrics
from tts_common.serving.interceptors import RefusingInterceptor
from tts_common.serving.names import PLUMBING_METHOD_PREFIXES

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


class ApiKeyInterceptor(RefusingInterceptor):
    """Rejects calls without a valid API key (see the module doc)."""

    def __init__(
        self,
        keys: Iterable[str],
        *,
        stage: str = "gateway",
        open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES,
    ) -> None:
        super().__init__(open_prefixes)
        self._keys = tuple(k.encode("utf-8") for k in keys if k)
        if not self._keys:
            raise ValueError("ApiKeyInterceptor needs at least one key")
        self._stage = stage

    def is_valid(self, key: str) -> bool:
        """Whether ``key`` is one of the configured keys (constant time per key)."""
        candidate = key.encode("utf-8")
        valid = False
        for known in self._keys:
            valid |= hmac.compare_digest(candidate, known)
        return valid

    def refusal(self, details: grpc.HandlerCallDetails) -> tuple[grpc.StatusCode, str] | None:
        key = extract_api_key(details.invocation_metadata)
        if key is None:
            code, message = (
                grpc.StatusCode.UNAUTHENTICATED,
                "missing API key: send 'authorization: Bearer KEY' or 'x-api-key: KEY' metadata",
            )
        elif not self.is_valid(key):
            code, message = grpc.StatusCode.PERMISSION_DENIED, "invalid API key"
        else:
            return None
        logger.info("rejected %s: %s", details.method, code.name)
        metrics.REQUESTS.labels(stage=self._stage, status=code.name).inc()
        return code, message


__all__ = ["ApiKeyInterceptor", "OPEN_METHOD_PREFIXES", "extract_api_key"]
