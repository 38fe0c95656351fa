"""Exception types shared by every stage, each tied to the gRPC status code it is reported as.

Raise these from request handling code (validation, lookups, admission control);
``tts_common.serving.rpc_errors`` (``grpc_status_for`` / ``abort_for_exception``) turns them into
gRPC statuses, so a client sees INVALID_ARGUMENT for a bad request instead of a generic INTERNAL
error. This module deliberately does not import grpc: model and validation code can raise these
without depending on the serving stack. The status is named by its ``grpc.StatusCode`` member
name.
"""

from __future__ import annotations

from typing import ClassVar


class TTSError(Exception):
    """Base class of the project's request errors. Reported as ``grpc_status`` (INTERNAL here)."""

    grpc_status: ClassVar[str] = "INTERNAL"

    retry_after_s: float | None = None
    """How long the client should wait before retrying, in seconds, where the raiser knows (None:
    no hint): gRPC trailing metadata ``retry-after`` and HTTP ``Retry-After``, in whole seconds."""


class InvalidRequestError(TTSError, ValueError):
    """The request is malformed or asks for something the loaded model cannot do (unknown
    language or speaker, instruct on a model that ignores it, empty text, bad audio, ...)."""

    grpc_status: ClassVar[str] = "INVALID_ARGUMENT"


class NotFoundError(TTSError, LookupError):
    """A referenced entity does not exist (e.g. an unknown registered ``voice_id``)."""

    grpc_status: ClassVar[str] = "NOT_FOUND"


class AlreadyExistsError(TTSError):
    """An entity with the requested id already exists."""

    grpc_status: ClassVar[str] = "ALREADY_EXISTS"


class CapacityError(TTSError):
    """The stage is at capacity (queue full, out of cache memory); the client may retry later."""

    grpc_status: ClassVar[str] = "RESOURCE_EXHAUSTED"


class UnavailableError(TTSError):
    """The stage cannot serve right now (model not loaded yet, shutting down, a downstream stage
    unreachable); retrying, possibly elsewhere, is appropriate."""

    grpc_status: ClassVar[str] = "UNAVAILABLE"


class PayloadTooLargeError(InvalidRequestError):
    """The request (or one of its parts, e.g. an upload) is larger than the server accepts.
    INVALID_ARGUMENT over gRPC (whose own message-size limit answers first); HTTP 413."""


class UnauthenticatedError(TTSError):
    """The call carries no credentials (no API key) where they are required."""

    grpc_status: ClassVar[str] = "UNAUTHENTICATED"


class PermissionDeniedError(TTSError):
    """The credentials are not accepted (an unknown API key)."""

    grpc_status: ClassVar[str] = "PERMISSION_DENIED"


class DeadlineExceededError(TTSError):
    """A time limit of the request ran out (e.g. a streamed text left idle too long)."""

    grpc_status: ClassVar[str] = "DEADLINE_EXCEEDED"


class FailedPreconditionError(TTSError):
    """The system is not in a state that allows the operation (e.g. a protocol violation inside
    a bidi stream: chunks before the start message)."""

    grpc_status: ClassVar[str] = "FAILED_PRECONDITION"


__all__ = [
    "AlreadyExistsError",
    "CapacityError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidRequestError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "TTSError",
    "UnauthenticatedError",
    "UnavailableError",
]
