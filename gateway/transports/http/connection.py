"""What every HTTP route and the WebSocket check and read of a connection before work starts:
readiness (503 while not serving) and the request id."""

from __future__ import annotations

from fastapi.requests import HTTPConnection

from tts_common.errors import TTSError, UnavailableError
from tts_common.serving.health import ServingHealth
from tts_common.serving.request_ids import new_request_id, resolve_request_id


def check_ready(health: ServingHealth | None) -> None:
    """UNAVAILABLE (503) unless the process is serving (``health`` None: always serving, for
    embedding in tests)."""
    reason = None if health is None else health.refusal_reason()
    if reason is not None:
        raise UnavailableError(reason)


def request_id_of(connection: HTTPConnection, explicit: str = "") -> str:
    """The request's id: ``explicit``, else the ``x-request-id`` header, else a new one
    (remembered on the connection for :func:`known_request_id`)."""
    request_id = resolve_request_id(explicit, metadata=connection.headers.items(), where="header")
    connection.state.request_id = request_id
    return request_id


def known_request_id(connection: HTTPConnection) -> str:
    """The id the request was handled under (:func:`request_id_of`), else its acceptable
    ``x-request-id`` header, else a new one: what its error answer and log line carry."""
    known = getattr(connection.state, "request_id", None)
    if known:
        return known
    try:
        return request_id_of(connection)
    except TTSError:  # an unacceptable x-request-id: the answer names a fresh id
        request_id = new_request_id()
        connection.state.request_id = request_id
        return request_id


__all__ = ["check_ready", "known_request_id", "request_id_of"]
