"""Process-wide logging setup with the current request id in every record.

The request id lives in a :class:`contextvars.ContextVar`. grpc.aio runs each RPC in its own
task, and tasks copy the context they are created in, so setting the id at the top of a handler
tags every log line of that request (including lines from helpers and libraries) without passing
it around, and never leaks into concurrent requests::

    with request_context(request.request_id):
        logger.info("prefill done")        # ... INFO talker my.module [req=abc123] prefill done

Work handed to threads keeps the id when started with ``asyncio.to_thread`` or
``contextvars.copy_context().run`` (plain ``threading.Thread`` does not copy the context).

A gateway serving several models also tags a request's records with its model
(:func:`model_context`): ``[req=abc123 model=base]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("qwen3tts_request_id", default=None)
MODEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("qwen3tts_model", default=None)

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-5s %(stage)s%(name)s%(request_tag)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def current_request_id() -> str | None:
    """The request id of the running context, or None outside a request."""
    return REQUEST_ID.get()


@contextlib.contextmanager
def _tagged(var: contextvars.ContextVar[str | None], value: str | None) -> Iterator[None]:
    token = var.set(value or None)
    try:
        yield
    finally:
        try:
            var.reset(token)
        except ValueError:
            # An async generator holding this block was finalised from another task (grpc closes
            # abandoned response streams that way): that task's context was never changed.
            pass


def request_context(request_id: str | None) -> contextlib.AbstractContextManager[None]:
    """Tag log records emitted inside the block with ``request_id`` (restored afterwards)."""
    return _tagged(REQUEST_ID, request_id)


def model_context(model: str | None) -> contextlib.AbstractContextManager[None]:
    """Tag log records emitted inside the block with the served ``model`` (restored afterwards)."""
    return _tagged(MODEL, model)


class RequestContextFilter(logging.Filter):
    """Adds ``request_id`` ("-" if none), ``request_tag`` (" [req=ID]", " [req=ID model=NAME]"
    or "") and ``stage`` ("NAME " or "") attributes to each record; installed on handlers, so it
    sees records of every logger."""

    def __init__(self, stage: str | None = None) -> None:
        super().__init__()
        self._stage = f"{stage} " if stage else ""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        model = MODEL.get()
        record.request_id = request_id or "-"
        tags = [f"req={request_id}" if request_id else "", f"model={model}" if model else ""]
        tag = " ".join(t for t in tags if t)
        record.request_tag = f" [{tag}]" if tag else ""
        record.stage = self._stage
        return True


_HANDLER_MARK = "_qwen3tts_handler"


def setup_logging(
    level: int | str = "INFO", *, stage: str | None = None, stream: TextIO | None = None
) -> logging.Handler:
    """Configure the root logger: one stream handler (stderr by default) with the project
    format and request-id tagging. Idempotent: calling it again replaces the handler it installed
    earlier (other handlers, e.g. pytest's capture, are left alone). Returns the handler."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            root.removeHandler(handler)
            handler.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    handler.addFilter(RequestContextFilter(stage))
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


__all__ = [
    "DATE_FORMAT",
    "LOG_FORMAT",
    "MODEL",
    "REQUEST_ID",
    "RequestContextFilter",
    "current_request_id",
    "model_context",
    "request_context",
    "setup_logging",
]
