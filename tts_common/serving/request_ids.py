"""Request ids: the message field, else the ``x-request-id`` call metadata, else a new one."""

from __future__ import annotations

import uuid

import grpc

REQUEST_ID_METADATA_KEY = "x-request-id"
"""Call metadata key carrying a request id (used when the message has none)."""


def new_request_id() -> str:
    """A fresh random request id (32 hex digits)."""
    return uuid.uuid4().hex


def resolve_request_id(explicit: str, context: grpc.aio.ServicerContext | None = None) -> str:
    """The request id to use: ``explicit`` (the message field) if set, else the
    ``x-request-id`` call metadata, else a new random id."""
    if explicit:
        return explicit
    if context is not None:
        for key, value in context.invocation_metadata() or ():
            if key == REQUEST_ID_METADATA_KEY and value:
                return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return new_request_id()


__all__ = ["REQUEST_ID_METADATA_KEY", "new_request_id", "resolve_request_id"]
