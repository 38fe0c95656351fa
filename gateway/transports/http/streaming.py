"""Streaming a synthesis over HTTP: the encoded bytes as they are produced (chunked transfer), or
OpenAI's server-sent events, and cancellation when the client goes away.

The route takes the first response of ``SynthesisService.synthesize`` (the metadata: the request
is validated, admitted and both stages are running) before it answers, so every request error
still becomes an HTTP status. After that the status line is sent; a later failure ends an audio
stream abruptly (the chunked body never terminates, so clients see a truncated transfer, not a
short file) and an SSE stream with an ``error`` event.

A client that disconnects cancels the task streaming the body (Starlette); the cancellation
reaches the synthesis generator, whose cleanup cancels both stage calls and frees the talker slot.
:class:`SynthesisResponse` closes the generator in every other case too (the client gone before
the first byte, the server stopping), so no admission slot outlives its HTTP request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Mapping

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tts_common.pb.qwen3tts.v1 import tts_pb2

from .errors import count, http_error, log_and_count

logger = logging.getLogger(__name__)

Responses = AsyncIterator[tts_pb2.SynthesizeResponse]


async def audio_bytes(responses: Responses, where: str) -> AsyncIterator[bytes]:
    """The encoded audio of every chunk, as it comes (empty chunks skipped)."""
    try:
        async for response in responses:
            if response.WhichOneof("payload") == "audio" and response.audio.data:
                yield response.audio.data
    except (asyncio.CancelledError, GeneratorExit):
        count(grpc.StatusCode.CANCELLED)
        raise
    except Exception as exc:
        log_and_count(http_error(exc), exc, where)
        raise
    count(grpc.StatusCode.OK)


def summary_object(summary: Message) -> dict[str, object]:
    """A ``SynthesisSummary`` (or ``UtteranceEnd``) as JSON: every field, numbers as numbers (proto
    JSON would quote 64-bit integers), enums (the finish reasons) by name, repeated fields as
    lists."""

    def value(field: FieldDescriptor, raw: object) -> object:
        if field.message_type is not None:
            return summary_object(raw)  # type: ignore[arg-type]
        if field.enum_type is not None:
            return field.enum_type.values_by_number[raw].name  # type: ignore[index]
        return raw

    result: dict[str, object] = {}
    for field in summary.DESCRIPTOR.fields:
        raw = getattr(summary, field.name)
        if field.is_repeated:
            result[field.name] = [value(field, item) for item in raw]
        else:
            result[field.name] = value(field, raw)
    return result


def sse_event(payload: Mapping[str, object]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(responses: Responses, where: str) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` (base64 audio in the requested format) per
    chunk, then ``speech.audio.done`` with our ``summary`` (frames, audio seconds, time to first
    audio, RTF, ...); a failure after the start is an ``error`` event with OpenAI's error
    object."""
    try:
        async for response in responses:
            kind = response.WhichOneof("payload")
            if kind == "audio" and response.audio.data:
                audio = base64.b64encode(response.audio.data).decode("ascii")
                yield sse_event({"type": "speech.audio.delta", "audio": audio})
            elif kind == "summary":
                yield sse_event({"type": "speech.audio.done", "summary": summary_object(response.summary)})
    except (asyncio.CancelledError, GeneratorExit):
        count(grpc.StatusCode.CANCELLED)
        raise
    except Exception as exc:  # noqa: BLE001 - reported to the client as an error event
        error = http_error(exc)
        log_and_count(error, exc, where)
        yield sse_event({"type": "error", **error.body()})
        return
    count(grpc.StatusCode.OK)


class SynthesisResponse(StreamingResponse):
    """A streaming response that always closes its synthesis (see the module doc)."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        responses: Responses,
        *,
        media_type: str,
        headers: Mapping[str, str],
    ) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._responses = responses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Normally already finished (or closed by the cancellation); this covers a body that
            # never started (the client gone before the status line) and server shutdown.
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._responses.aclose()  # type: ignore[attr-defined]


__all__ = ["SynthesisResponse", "audio_bytes", "sse_event", "sse_events", "summary_object"]
