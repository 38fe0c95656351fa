"""Request ids: the message field, else the ``x-request-id`` call metadata, else a new one.

A client's id travels on: into log lines and, as call metadata, to every stage. So it is checked
where it enters (:func:`check_request_id`): at most :data:`MAX_REQUEST_ID_CHARS` characters from
:data:`REQUEST_ID_ALPHABET` (enough for UUIDs, ULIDs, W3C trace ids and most tracing schemes),
INVALID_ARGUMENT otherwise. A newline in an id would otherwise reach a stage as invalid metadata,
and a huge one exceed the stages' metadata size limit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

import grpc

from tts_common.errors import InvalidRequestError

REQUEST_ID_METADATA_KEY = "x-request-id"
"""Call metadata key carrying a request id (used when the message has none)."""


MAX_REQUEST_ID_CHARS = 128
"""Longest accepted client request id."""
REQUEST_ID_ALPHABET = "A-Z a-z 0-9 and . _ - : / @ + = ~"
"""Characters a client request id may use (as documented in error messages)."""
_REQUEST_ID = re.compile(r"[A-Za-z0-9._\-:/@+=~]+")


def check_request_id(value: str, source: str = "request_id") -> str:
    """``value`` if it is an acceptable client request id, else INVALID_ARGUMENT naming
    ``source`` (the field or the metadata key)."""
    if len(value) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestError(
            f"{source} is too long: {len(value)} characters (maximum {MAX_REQUEST_ID_CHARS})"
        )
    if not _REQUEST_ID.fullmatch(value):
        raise InvalidRequestError(f"{source} {value[:40]!r} has characters outside {REQUEST_ID_ALPHABET}")
    return value


def new_request_id() -> str:
    """A fresh random request id (32 hex digits)."""
    return uuid.uuid4().hex


def resolve_request_id(
    explicit: str,
    context: grpc.aio.ServicerContext | None = None,
    *,
    metadata: Iterable[tuple[str, str | bytes]] | None = None,
    where: str = "metadata",
) -> str:
    """The request id to use: ``explicit`` (the message field) if set, else the
    ``x-request-id`` call metadata (of ``context``, or the ``metadata`` pairs such as HTTP
    headers, named ``where`` in errors), else a new random id. A client's id is checked
    (:func:`check_request_id`); INVALID_ARGUMENT if it is not acceptable."""
    if explicit:
        return check_request_id(explicit)
    if context is not None:
        metadata = context.invocation_metadata()
    for key, value in metadata or ():
        if key == REQUEST_ID_METADATA_KEY and value:
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            return check_request_id(text, f"{REQUEST_ID_METADATA_KEY} {where}")
    return new_request_id()


__all__ = [
    "MAX_REQUEST_ID_CHARS",
    "REQUEST_ID_ALPHABET",
    "REQUEST_ID_METADATA_KEY",
    "check_request_id",
    "new_request_id",
    "resolve_request_id",
]
