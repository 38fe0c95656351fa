"""Streaming a synthesis over HTTP: the encoded bytes as they are produced (chunked transfer), or
OpenAI's server-sent events, and cancellation when the client goes away; or (``stream_format``
``json``) one JSON body with the audio, its timestamps and the summary.

Timestamps (``"timestamps": "word"`` or ``"character"``) reach HTTP clients as
``speech.audio.timestamps`` objects (:func:`timestamps_event`): one per utterance, its ``words``
(or ``characters``) each with ``text``, ``start`` and ``end`` in seconds of the audio as sent, and
``char_start`` / ``char_end`` (code points of the input).

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


def unit_object(unit: tts_pb2.TimedUnit, sample_rate: int) -> dict[str, object]:
    """One timed unit as JSON: its text, start and end in seconds of the audio as sent, its
    span of the input."""
    return {
        "text": unit.text,
        "start": unit.start_sample / sample_rate,
        "end": unit.end_sample / sample_rate,
        "char_start": unit.char_start,
        "char_end": unit.char_end,
    }


def units_key(unit: int) -> str:
    """The JSON key of a unit kind's list: ``words`` or ``characters``."""
    return "characters" if unit == tts_pb2.TIMESTAMP_UNIT_CHARACTER else "words"


def timestamps_event(message: tts_pb2.Timestamps, sample_rate: int) -> dict[str, object]:
    """One utterance's timings as a ``speech.audio.timestamps`` object (``error`` set, and no
    units, when the aligner could not time it)."""
    event: dict[str, object] = {
        "type": "speech.audio.timestamps",
        "index": message.index,
        units_key(message.unit): [unit_object(u, sample_rate) for u in message.units],
    }
    if message.error:
        event["error"] = message.error
    return event


def sse_event(payload: Mapping[str, object]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(responses: Responses, where: str, sample_rate: int) -> AsyncIterator[bytes]:
    """OpenAI's speech events: ``speech.audio.delta`` (base64 audio in the requested format) per
    chunk, ``speech.audio.timestamps`` per utterance when asked for (between the deltas, as soon
    as known; ``sample_rate``: the audio's), then ``speech.audio.done`` with our ``summary``
    (frames, audio seconds, time to first audio, RTF, ...); a failure after the start is an
    ``error`` event with OpenAI's error object."""
    try:
        async for response in responses:
            kind = response.WhichOneof("payload")
            if kind == "audio" and response.audio.data:
                audio = base64.b64encode(response.audio.data).decode("ascii")
                yield sse_event({"type": "speech.audio.delta", "audio": audio})
            elif kind == "timestamps":
                yield sse_event(timestamps_event(response.timestamps, sample_rate))
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


async def json_body(
    responses: Responses, metadata: tts_pb2.SynthesisMetadata, unit: str
) -> dict[str, object]:
    """The whole synthesis as one JSON object (``stream_format`` ``json``): ``audio`` (base64, in
    the requested format), ``sample_rate``, ``request_id``, the ``words`` (or ``characters``,
    ``unit`` being the request's ``timestamps``; in order, across every segment) when asked for,
    ``timestamps_errors`` (segment index -> why it has no timings; empty when all have) and the
    ``summary``. An error anywhere is the HTTP error (nothing was sent yet)."""
    audio: list[bytes] = []
    timings: list[tts_pb2.Timestamps] = []
    summary = tts_pb2.SynthesisSummary()
    async for response in responses:
        kind = response.WhichOneof("payload")
        if kind == "audio":
            audio.append(response.audio.data)
        elif kind == "timestamps":
            timings.append(response.timestamps)
        elif kind == "summary":
            summary = response.summary
    body: dict[str, object] = {
        "audio": base64.b64encode(b"".join(audio)).decode("ascii"),
        "sample_rate": metadata.sample_rate,
        "request_id": metadata.request_id,
    }
    if unit != "none":
        timings.sort(key=lambda t: t.index)
        key = "characters" if unit == "character" else "words"
        body[key] = [unit_object(u, metadata.sample_rate) for t in timings for u in t.units]
        body["timestamps_errors"] = {str(t.index): t.error for t in timings if t.error}
    body["summary"] = summary_object(summary)
    return body


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


__all__ = [
    "SynthesisResponse",
    "audio_bytes",
    "json_body",
    "sse_event",
    "sse_events",
    "summary_object",
    "timestamps_event",
    "unit_object",
    "units_key",
]
