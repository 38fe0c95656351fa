"""Errors of stage calls as the client sees them: :class:`StageError` (a status and a message
naming the stage), and which failures another replica may take over
(:func:`is_connection_failure`).

A client is told which stage failed and what happened, with the request id to quote; never the
call's details, which are grpc-core's words where grpc-core ended the call ("failed to connect to
all addresses; last error: ... ipv4:10.0.0.5:50051 ...": the stage's addresses, debug strings).
Those go to the log, tagged with the request id. Only a stage's verdict on the request itself
(:data:`VERDICTS`: our stages' own messages, written for clients) reaches the client in its words.
"""

from __future__ import annotations

import logging
import re

import grpc

from tts_common.errors import TTSError
from tts_common.logging_setup import current_request_id

logger = logging.getLogger(__name__)

CONNECTION_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""Statuses of a stage call that fail over: the replica died, restarted, hung (keepalive
timeout), is shutting down or not ready, or cancelled the call itself. Every other status is
the stage's verdict on the request and reaches the client."""


LOCAL_SEND_FAILURE = "Internal error from Core"
"""The details grpc's asyncio client gives a call whose message it could not send (its
``set_internal_error``: the status is INTERNAL, but no server said so)."""


def is_connection_failure(code: grpc.StatusCode) -> bool:
    """Whether a stage call that ended with ``code`` should move to another replica."""
    return code in CONNECTION_FAILURES


# Upstream statuses passed to the client unchanged (any other one becomes UNAVAILABLE).
_PASS_THROUGH = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DATA_LOSS,
}

VERDICTS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""Statuses that are a stage's verdict on the request (bad input, unknown speaker, at capacity):
the client is told the stage's own message, which says what to change."""

_WHAT_HAPPENED = {
    grpc.StatusCode.UNAVAILABLE: "is unavailable; retry later",
    grpc.StatusCode.DEADLINE_EXCEEDED: "did not answer within the request's deadline",
    grpc.StatusCode.UNIMPLEMENTED: "does not implement this call (a version older than the gateway's?)",
    grpc.StatusCode.PERMISSION_DENIED: "refused the gateway's call",
    grpc.StatusCode.UNAUTHENTICATED: "refused the gateway's call",
    grpc.StatusCode.ABORTED: "aborted the request; retry later",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "is at capacity; retry later",
    grpc.StatusCode.INVALID_ARGUMENT: "rejected the request",
    grpc.StatusCode.NOT_FOUND: "did not find what the request names",
    grpc.StatusCode.FAILED_PRECONDITION: "cannot serve this request",
    grpc.StatusCode.OUT_OF_RANGE: "rejected a value out of range",
    grpc.StatusCode.ALREADY_EXISTS: "already has what the request creates",
}
"""What happened, by status, where the details are not the client's to see (any other status:
an internal error of the stage)."""

_INTERNALS = re.compile(
    r"\b(?:ipv4|ipv6|unix|unix-abstract|dns|vsock):"  # grpc-core's spelling of an address
    r"|\d{1,3}(?:\.\d{1,3}){3}"  # an IPv4 address
    r"|\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\]"  # a bracketed IPv6 address
    r"|\b[\w.-]+:\d{2,5}\b"  # host:port
    r"|grpc_status|grpc_message|created_time|debug_error_string|last error|Traceback|File \""
    r"|message larger than max|Socket closed|Connection (?:refused|reset)|Internal error from Core"
)
"""What in a stage's details is an internal (an address, grpc-core's words): a verdict whose
details contain any of it is told as :data:`_WHAT_HAPPENED` says instead."""


def shows_details(code: grpc.StatusCode, details: str) -> bool:
    """Whether a client may see the ``details`` of a stage call that ended with ``code``: a
    verdict's (:data:`VERDICTS`), unless they hold an internal (an address, grpc-core's words)."""
    return code in VERDICTS and bool(details) and not _INTERNALS.search(details)


def client_message(stage: str, code: grpc.StatusCode, details: str, request_id: str | None) -> str:
    """What a client is told about a ``stage`` call that ended with ``code`` and ``details``:
    a verdict in the stage's words (:func:`shows_details`); else the stage and what happened,
    with ``request_id`` (the details are in the log under it)."""
    if shows_details(code, details):
        return f"{stage} stage: {details}"
    what = _WHAT_HAPPENED.get(code, "failed with an internal error")
    where = f" (request id {request_id})" if request_id else ""
    return f"the {stage} stage {what}{where}"


class StageError(TTSError):
    """A stage call failed; reported to the client with ``grpc_status`` and a message that
    names the stage (:func:`client_message`; ``details``, grpc-core's or the stage's words, is
    logged with the request id instead where it is not the client's to see). Connection-level
    failures (and a stage cancelling on its own, e.g. while shutting down) become UNAVAILABLE.
    ``connection_failure``: whether another replica may take the call over (default: by the
    status, :func:`is_connection_failure`)."""

    def __init__(
        self,
        stage: str,
        code: grpc.StatusCode,
        details: str,
        *,
        connection_failure: bool | None = None,
    ) -> None:
        self.stage = stage
        self.details = details
        self.connection_failure = (
            is_connection_failure(code) if connection_failure is None else connection_failure
        )
        self.code = code if code in _PASS_THROUGH else grpc.StatusCode.UNAVAILABLE
        self.grpc_status = self.code.name  # type: ignore[misc]  # per-instance status
        self.request_id = current_request_id()
        if not shows_details(self.code, details):
            # Logged here, where the request's log context still holds (a transport sees the
            # error after it is left); a call that may still fail over is routine.
            level = logging.INFO if self.connection_failure else logging.WARNING
            logger.log(level, "%s stage call failed (%s): %s", stage, code.name, details)
        super().__init__(client_message(stage, self.code, details, self.request_id))

    @classmethod
    def from_rpc_error(cls, stage: str, exc: grpc.aio.AioRpcError) -> StageError:
        """The error of a failed stage call. grpc-core failing to send on a connection that
        broke (the replica died mid-stream; every later read of the call reports it too) is a
        connection failure, which another replica may take over; any other status is the
        stage's. (A stream call of the pipeline first looks for the status the stage sent, which
        grpc's failed send can hide: ``gateway.stages.stage_call.StageCall.error``.)"""
        if exc.code() is grpc.StatusCode.INTERNAL and exc.details() == LOCAL_SEND_FAILURE:
            return cls(
                stage, grpc.StatusCode.UNAVAILABLE, f"sending to it failed ({exc.debug_error_string()})"
            )
        return cls(stage, exc.code(), exc.details() or exc.code().name)

    def final(self, details: str) -> StageError:
        """The error to end the stream with after failover gave up (same stage and status)."""
        return StageError(self.stage, self.code, details, connection_failure=False)


__all__ = [
    "CONNECTION_FAILURES",
    "LOCAL_SEND_FAILURE",
    "VERDICTS",
    "StageError",
    "client_message",
    "is_connection_failure",
    "shows_details",
]
