"""What every HTTP route and the WebSocket check and read of a connection before work starts:
readiness (503 while not serving) and the request id."""

from __future__ import annotations

from fastapi.requests import HTTPConnection

from tts_common.errors import UnavailableError
from tts_common.serving.health import ServingHealth
from tts_common.serving.request_ids import resolve_request_id


def check_ready(health: ServingHealth | None) -> None:
    """UNAVAILABLE (503) unless the process is serving (``health`` None: always serving, for
    embedding in tests)."""
    reason = None if health is None else health.refusal_reason()
    if reason is not None:
        raise UnavailableError(reason)


def request_id_of(connection: HTTPConnection, explicit: str = "") -> str:
    """The request's id: ``explicit``, else the ``x-request-id`` header, else a new one."""
    return resolve_request_id(explicit, metadata=connection.headers.items(), where="header")


__all__ = ["check_ready", "request_id_of"]
