"""``WebSocket /v1/audio/speech/stream``: text in as it is written, audio out as it is spoken, on
the gateway's StreamingSynthesize core (:meth:`gateway.service.SynthesisService.stream_synthesize`),
so the checks, cuts, cancel and limits are the gRPC API's own.

Client messages are JSON text frames, each with a ``type``:

* ``config`` (first, once): the ``POST /v1/audio/speech`` body without ``input`` (``voice``,
  ``instructions``, ``response_format`` -- ``pcm`` by default here --, ``speed``, and our fields:
  ``language``, ``seed`` and the other sampling fields, ``text_feeding``, chunk sizes), plus
  ``api_key`` for clients that cannot set headers (browsers); ``model`` is optional;
* ``text`` with ``"text": "..."``: the next piece of the text, split anywhere;
* ``flush``: the text so far is a complete utterance;
* ``cancel``: stop speaking now (barge-in); the stream stays open for more text;
* ``end``: the text is complete (gRPC's half-close).

Server messages: a JSON ``metadata`` message (sample rate, encoding, request id, seed...), the
audio as binary frames (the chunks' bytes in ``response_format``, concatenating to one stream),
a JSON ``utterance_end`` per utterance, and a final JSON ``summary``, after which the server closes
the socket (1000). A failure is a JSON ``error`` message (OpenAI's error object, as the HTTP API
answers it) and a close with code 4000 + the HTTP status (4400 bad input, 4401/4403 API key, 4404
unknown voice, 4429 at capacity, 4503 unavailable, 4504 the text left idle too long).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, Protocol

import grpc
from fastapi import WebSocket, WebSocketDisconnect
from fastapi.requests import HTTPConnection
from google.protobuf.json_format import MessageToDict
from pydantic import Field, ValidationError, create_model

from tts_common.errors import InvalidRequestError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..auth import ApiKeys
from ..service import SynthesisService
from ..text_input import read_config
from .errors import count, http_error, log_and_count, validation_error
from .formats import FormatName
from .schemas import SpeechRequest
from .speech import synthesize_request
from .streaming import summary_object


class StreamingApi(Protocol):
    """What a :class:`SpeechStream` uses of :class:`gateway.http.app.HttpApi` (which routes the
    WebSocket to it; a protocol keeps this module from importing the app back)."""

    service: SynthesisService
    aliases: Mapping[str, str]
    keys: ApiKeys | None

    def check_ready(self) -> None: ...

    def request_id(self, connection: HTTPConnection, explicit: str = "") -> str: ...


logger = logging.getLogger(__name__)

STREAM_PATH = "/v1/audio/speech/stream"
CLOSE_CODE_BASE = 4000
"""Close code of a failure: this + the HTTP status the same failure gets on the HTTP API."""
MAX_CLOSE_REASON_BYTES = 120
"""A close frame's reason is at most 123 bytes; the full message is in the error message."""

StreamConfig: type[SpeechRequest] = create_model(  # type: ignore[call-overload,valid-type]
    "StreamConfig",
    __base__=SpeechRequest,
    __doc__="The config message of WebSocket /v1/audio/speech/stream.",
    type=(Literal["config"], ...),
    model=(str, ""),
    input=(str, Field("", description="Must be empty: the text comes in `text` messages.")),
    response_format=(FormatName, "pcm"),
    api_key=(str, ""),
)
"""The ``config`` message: the speech body's fields (``input`` empty) plus ``api_key``."""


class _ClientGoneError(Exception):
    """The client went away."""


async def _receive(websocket: WebSocket) -> dict[str, Any] | None:
    """The next client message as a JSON object (None when the client closed the socket)."""
    try:
        message = await websocket.receive()
    except WebSocketDisconnect:
        return None
    if message["type"] == "websocket.disconnect":
        return None
    raw = message.get("text")
    if raw is None:
        raise InvalidRequestError("binary message: send JSON text messages")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"message is not JSON: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequestError('message is not a JSON object with a "type"')
    return value


class SpeechStream:
    """One WebSocket connection (see the module doc)."""

    def __init__(self, api: StreamingApi, websocket: WebSocket) -> None:
        self.api = api
        self.websocket = websocket
        self.request_id = ""
        self.speed = 1.0
        self.closed_by_client = False

    async def messages(self) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
        """The client's messages as StreamingSynthesize messages; ends at ``end``; raises
        :class:`_ClientGoneError` when the client goes away (the stream is then cancelled)."""
        first = True
        while True:
            value = await _receive(self.websocket)
            if value is None:
                self.closed_by_client = True
                raise _ClientGoneError
            kind = value["type"]
            if kind == "config":
                if not first:
                    yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesizeRequest())
                    continue
                yield tts_pb2.StreamingSynthesizeRequest(config=await self.config(value))
            elif kind == "text":
                text = value.get("text")
                if not isinstance(text, str):
                    raise InvalidRequestError('a "text" message needs "text": a string')
                yield tts_pb2.StreamingSynthesizeRequest(text=text)
            elif kind == "flush":
                yield tts_pb2.StreamingSynthesizeRequest(flush=tts_pb2.FlushText())
            elif kind == "cancel":
                yield tts_pb2.StreamingSynthesizeRequest(cancel=tts_pb2.CancelUtterance())
            elif kind == "end":
                return
            else:
                raise InvalidRequestError(
                    f'unknown message type {kind!r} (expected "config", "text", "flush", "cancel" or "end")'
                )
            first = False

    async def config(self, value: dict[str, Any]) -> tts_pb2.SynthesizeRequest:
        """The SynthesizeRequest of a config message (the API key checked first)."""
        api = self.api
        if api.keys is not None:
            headers: list[tuple[str, str]] = list(self.websocket.headers.items())
            if isinstance(value.get("api_key"), str) and value["api_key"]:
                headers.append(("authorization", f"Bearer {value['api_key']}"))
            api.keys.authenticate(headers, 'header or config "api_key"')
        try:
            body = StreamConfig.model_validate(value)
        except ValidationError as exc:
            raise InvalidRequestError(validation_error(exc.errors()).message) from None
        if body.input:
            raise InvalidRequestError("input must be empty: send the text in `text` messages")
        self.request_id = api.request_id(self.websocket, body.request_id)
        self.speed = body.speed
        info = await api.service.public_model_info()
        return synthesize_request(body, self.request_id, info, api.service.voices, api.aliases)

    async def run(self) -> None:
        """Serve the connection until the summary, a failure or the client leaving."""
        websocket = self.websocket
        await websocket.accept()
        received = time.monotonic()
        try:
            self.api.check_ready()
            messages = self.messages()
            config = await read_config(messages)
            with request_context(self.request_id):
                responses = self.api.service.stream_synthesize(
                    config, messages, self.request_id, received=received, speed=self.speed
                )
                async for response in responses:
                    await self.send(response)
            count(grpc.StatusCode.OK)
            await websocket.close(1000)
        except (_ClientGoneError, WebSocketDisconnect):
            logger.info("%s: the client went away", STREAM_PATH)
            count(grpc.StatusCode.CANCELLED)
        except Exception as exc:  # noqa: BLE001 - every failure is answered the same way
            if self.closed_by_client:
                count(grpc.StatusCode.CANCELLED)
                return
            error = http_error(exc)
            log_and_count(error, exc, f"WS {STREAM_PATH} [{self.request_id}]")
            try:
                await websocket.send_json({"type": "error", **error.body()})
                reason = error.message.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
                await websocket.close(CLOSE_CODE_BASE + error.status, reason)
            except (WebSocketDisconnect, RuntimeError):
                pass  # the client is gone already

    async def send(self, response: tts_pb2.SynthesizeResponse) -> None:
        kind = response.WhichOneof("payload")
        if kind == "audio":
            if response.audio.data:
                await self.websocket.send_bytes(response.audio.data)
        elif kind == "metadata":
            metadata = MessageToDict(response.metadata, preserving_proto_field_name=True)
            metadata["seed"] = response.metadata.sampling.seed  # a number (proto JSON quotes it)
            await self.websocket.send_json({"type": "metadata", **metadata})
        elif kind == "utterance_end":
            await self.websocket.send_json(
                {"type": "utterance_end", **summary_object(response.utterance_end)}
            )
        elif kind == "summary":
            await self.websocket.send_json({"type": "summary", "summary": summary_object(response.summary)})


__all__ = ["STREAM_PATH", "SpeechStream", "StreamConfig"]
