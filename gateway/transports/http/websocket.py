"""``WebSocket /v1/audio/speech/stream``: text in as it is written, audio out as it is spoken, on
the gateway's StreamingSynthesize core (:class:`gateway.core.streamed.StreamedSynthesis`), so the
checks, cuts, cancel and limits are the gRPC API's own.

Client messages are JSON text frames, each with a ``type``:

* ``config`` (first, once): the ``POST /v1/audio/speech`` body without ``input`` (``voice``,
  ``instructions``, ``response_format`` -- ``pcm`` by default here --, ``speed``, and our fields:
  ``language``, ``seed`` and the other sampling fields, ``text_feeding``, chunk sizes,
  ``timestamps``: ``"word"`` or ``"character"``), plus
  ``api_key`` for clients that cannot set headers (browsers); ``model`` is optional (the
  default model);
* ``text`` with ``"text": "..."``: the next piece of the text, split anywhere;
* ``flush``: the text so far is a complete utterance;
* ``cancel``: stop speaking now (barge-in); the stream stays open for more text;
* ``end``: the text is complete (gRPC's half-close).

Server messages: a JSON ``metadata`` message (sample rate, encoding, request id, seed...), the
audio as binary frames (the chunks' bytes in ``response_format``, concatenating to one stream),
a JSON ``utterance_end`` per utterance, with ``timestamps`` a JSON ``speech.audio.timestamps``
per utterance (its ``words`` or ``characters``: ``text``, ``start`` / ``end`` in seconds of the
audio as sent, ``char_start`` / ``char_end`` in the streamed text; as soon as known, between later
audio; a cancelled utterance's ``utterance_end`` names its ``last_unit`` sent whole, or null), and
a final JSON ``summary``, after which the server closes the socket (1000). A failure is a JSON ``error`` message (OpenAI's error object, as the HTTP API
answers it) and a close with code 4000 + the HTTP status (4400 bad input, 4401/4403 API key, 4404
unknown voice, 4429 at capacity, 4503 unavailable, 4504 the text left idle too long).

A key sent as a handshake header is checked before the connection is accepted (a wrong one: the
handshake is refused, HTTP 403); a connection that sends no ``config`` within
``--websocket-config-timeout-seconds`` (10 s) is closed with 1008 (policy violation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import grpc
from fastapi import WebSocket, WebSocketDisconnect
from google.protobuf.json_format import MessageToDict
from pydantic import Field, ValidationError, create_model

from tts_common.errors import InvalidRequestError, TTSError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth

from ...core import Gateway
from ...synthesis.text_cutter import read_config
from ...voice_library import NO_KEYS
from ..auth import ApiKeys, Callers, extract_api_key
from ..text import check_text
from .connection import check_ready, request_id_of
from .errors import count, http_error, log_and_count, validation_error
from .formats import FormatName
from .schemas import SpeechRequest
from .speech import speech_request
from .streaming import summary_object, timestamps_event, unit_object

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


POLICY_VIOLATION = 1008
"""Close code of a connection refused for its key at the handshake, or that sent no ``config``
in time (RFC 6455's policy violation)."""


class _ClientGoneError(Exception):
    """The client went away."""


class _NoConfigError(Exception):
    """The client sent no message within the configuration deadline."""


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
    check_text(value, "")  # before any of it (the api_key too) is used
    return value


class SpeechStream:
    """One WebSocket connection (see the module doc)."""

    def __init__(
        self,
        websocket: WebSocket,
        gateway: Gateway,
        aliases: Mapping[str, str],
        keys: ApiKeys | None,
        health: ServingHealth | None,
        callers: Callers | None = None,
        *,
        config_timeout: float = 10.0,
    ) -> None:
        """``aliases``: the voice aliases; ``keys``: the accepted API keys (None: no
        authentication); ``health``: the process's (None: always serving); ``callers``: whose
        stream it is, for its registered voices (None: no API keys); ``config_timeout``: seconds
        the client has to send its ``config`` (then the socket is closed with 1008)."""
        self.websocket = websocket
        self.gateway = gateway
        self.aliases = aliases
        self.keys = keys
        self.health = health
        self.callers = callers
        self.caller = NO_KEYS
        self.request_id = ""
        self.speed = 1.0
        self.sample_rate = 0
        """The audio's, from the metadata (for timestamps in seconds)."""
        self.closed_by_client = False
        self.config_timeout = config_timeout

    async def messages(self) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
        """The client's messages as StreamingSynthesize messages; ends at ``end``; raises
        :class:`_ClientGoneError` when the client goes away (the stream is then cancelled)."""
        first = True
        while True:
            if first:  # an unauthenticated socket must not stay open: the config has a deadline
                try:
                    value = await asyncio.wait_for(_receive(self.websocket), self.config_timeout)
                except TimeoutError:
                    raise _NoConfigError from None
            else:
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
        if self.keys is not None:
            headers: list[tuple[str, str]] = list(self.websocket.headers.items())
            if isinstance(value.get("api_key"), str) and value["api_key"]:
                headers.append(("authorization", f"Bearer {value['api_key']}"))
            self.keys.authenticate(headers, 'header or config "api_key"')
            if self.callers is not None:
                self.caller = self.callers.of(headers)
        try:
            body = StreamConfig.model_validate(value)
        except ValidationError as exc:
            raise InvalidRequestError(validation_error(exc.errors()).message) from None
        if body.input:
            raise InvalidRequestError("input must be empty: send the text in `text` messages")
        self.request_id = request_id_of(self.websocket, body.request_id)
        self.speed = body.speed
        return await speech_request(body, self.request_id, self.gateway, self.aliases)

    async def run(self) -> None:
        """Serve the connection until the summary, a failure or the client leaving."""
        websocket = self.websocket
        if not await self.handshake_key_accepted():
            return
        await websocket.accept()
        received = time.monotonic()
        try:
            check_ready(self.health)
            messages = self.messages()
            config = await read_config(messages)
            with request_context(self.request_id):
                responses = self.gateway.streamed.synthesize(
                    config, messages, self.request_id, caller=self.caller, received=received, speed=self.speed
                )
                async for response in responses:
                    await self.send(response)
            count(grpc.StatusCode.OK)
            await websocket.close(1000)
        except (_ClientGoneError, WebSocketDisconnect):
            logger.info("%s: the client went away", STREAM_PATH)
            count(grpc.StatusCode.CANCELLED)
        except _NoConfigError:
            logger.info("%s: no config within %g s: closed", STREAM_PATH, self.config_timeout)
            count(grpc.StatusCode.DEADLINE_EXCEEDED)
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await websocket.close(POLICY_VIOLATION, f"no config message within {self.config_timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - every failure is answered the same way
            if self.closed_by_client:
                count(grpc.StatusCode.CANCELLED)
                return
            error = http_error(exc, self.request_id)
            log_and_count(error, exc, f"WS {STREAM_PATH} [{self.request_id}]")
            try:
                await websocket.send_json({"type": "error", **error.body()})
                reason = error.message.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
                await websocket.close(CLOSE_CODE_BASE + error.status, reason)
            except (WebSocketDisconnect, RuntimeError):
                pass  # the client is gone already

    async def handshake_key_accepted(self) -> bool:
        """Whether the connection may be accepted: a key sent in the handshake's headers is
        checked now and a wrong one refused before accepting (the client sees HTTP 403); without
        one the key may come in ``config`` (browsers cannot set headers)."""
        if self.keys is None or extract_api_key(self.websocket.headers.items()) is None:
            return True
        try:
            self.keys.authenticate(self.websocket.headers.items(), "header")
        except TTSError as exc:
            logger.info("%s: refused at the handshake: %s", STREAM_PATH, exc)
            count(grpc.StatusCode[exc.grpc_status])
            await self.websocket.close(POLICY_VIOLATION)
            return False
        return True

    async def send(self, response: tts_pb2.SynthesizeResponse) -> None:
        kind = response.WhichOneof("payload")
        if kind == "audio":
            if response.audio.data:
                await self.websocket.send_bytes(response.audio.data)
        elif kind == "metadata":
            metadata = MessageToDict(response.metadata, preserving_proto_field_name=True)
            metadata["seed"] = response.metadata.sampling.seed  # a number (proto JSON quotes it)
            self.sample_rate = response.metadata.sample_rate
            await self.websocket.send_json({"type": "metadata", **metadata})
        elif kind == "utterance_end":
            end = response.utterance_end
            message = {"type": "utterance_end", **summary_object(end)}
            message["last_unit"] = (
                unit_object(end.last_unit, self.sample_rate) if end.HasField("last_unit") else None
            )
            await self.websocket.send_json(message)
        elif kind == "timestamps":
            await self.websocket.send_json(timestamps_event(response.timestamps, self.sample_rate))
        elif kind == "summary":
            await self.websocket.send_json({"type": "summary", "summary": summary_object(response.summary)})


__all__ = ["STREAM_PATH", "SpeechStream", "StreamConfig"]
