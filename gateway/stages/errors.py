"""Errors of stage calls as the client sees them: :class:`StageError` (a status and a message
naming the stage), and which failures another replica may take over
(:func:`is_connection_failure`)."""

from __future__ import annotations

import grpc

from tts_common.errors import TTSError

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


# Upstream statuses passed to the client unchanged (the stage's message, prefixed by its name).
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


class StageError(TTSError):
    """A stage call failed; reported to the client with ``grpc_status`` and a message that
    names the stage. Connection-level failures (and a stage cancelling on its own, e.g. while
    shutting down) become UNAVAILABLE. ``connection_failure``: whether another replica may
    take the call over (default: by the status, :func:`is_connection_failure`)."""

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
        if self.code is grpc.StatusCode.UNAVAILABLE:
            message = f"{stage} stage unavailable: {details}"
        else:
            message = f"{stage} stage: {details}"
        super().__init__(message)

    @classmethod
    def from_rpc_error(cls, stage: str, exc: grpc.aio.AioRpcError) -> StageError:
        """The error of a failed stage call. grpc-core failing to send on a connection that
        broke (the replica died mid-stream; every later read of the call reports it too) is a
        connection failure, which another replica may take over; any other status is the
        stage's."""
        if exc.code() is grpc.StatusCode.INTERNAL and exc.details() == LOCAL_SEND_FAILURE:
            return cls(
                stage, grpc.StatusCode.UNAVAILABLE, f"sending to it failed ({exc.debug_error_string()})"
            )
        return cls(stage, exc.code(), exc.details() or exc.code().name)

    def final(self, details: str) -> StageError:
        """The error to end the stream with after failover gave up (same stage and status)."""
        return StageError(self.stage, self.code, details, connection_failure=False)


__all__ = ["CONNECTION_FAILURES", "LOCAL_SEND_FAILURE", "StageError", "is_connection_failure"]
