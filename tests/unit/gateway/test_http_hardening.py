"""Issue 29's findings, each pinned by the example that broke it: text that is not valid Unicode
on every surface (HTTP JSON and multipart, WebSocket, gRPC, including messages that do not
parse) is a clean INVALID_ARGUMENT naming the field; errors carry no internals (class names,
reprs, addresses) but the request id; keys are checked before bodies; an unauthenticated
WebSocket cannot stay open; HTTP framing is strict. (Hostile property cases: test_http_hostile;
the OpenAPI document: test_http_openapi.)"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import grpc
import httpx2
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.helpers.fake_stages import Harness, run
from tests.unit.gateway.test_http_websocket import read_until_closed, ws_url
from tts_common.pb.qwen3tts.v1 import tts_pb2

KEY = "k1"
AUTH = {"authorization": f"Bearer {KEY}"}
INTERNALS = re.compile(r"Error\b|Exception|Traceback|<[^>]* at 0x|0x[0-9a-f]{6,}|codec|\.py\b|/work/|class '")
"""What an answer to a client never contains: exception names, reprs, addresses, paths."""


def assert_clean(message: str) -> None:
    assert not INTERNALS.search(message), message


def speech_body(**fields: Any) -> dict[str, Any]:
    return {"input": "Hello.", "voice": "vivian", "response_format": "pcm", **fields}


def raw_json(value: dict[str, Any]) -> bytes:
    """``value`` as JSON with lone surrogates kept as ``\\ud800`` escapes (json.dumps's default)."""
    return json.dumps(value).encode("ascii")


# --- finding 2: a lone surrogate in any text field ------------------------------------------
@pytest.mark.parametrize("field", ["input", "instructions", "language", "voice", "model", "request_id"])
def test_lone_surrogate_in_a_speech_field_is_400_naming_it(field: str) -> None:
    async def main() -> None:
        async with Harness(http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
            response = await client.post(
                "/v1/audio/speech",
                content=raw_json(speech_body(**{field: "ab\ud800c"})),
                headers={"content-type": "application/json"},
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == field and error["code"] == "invalid_argument"
            assert "not valid Unicode" in error["message"]
            assert_clean(error["message"])

    run(main())


def test_lone_surrogate_in_voice_metadata_is_400() -> None:
    async def main() -> None:
        async with Harness(http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
            patch = await client.patch(
                "/v1/audio/voices/voice-" + "0" * 32,
                content=raw_json({"labels": {"lang": "\udfff"}}),
                headers={"content-type": "application/json"},
            )
            assert patch.status_code == 400, patch.text
            assert "labels: lang: not valid Unicode" in patch.json()["error"]["message"]

    run(main())


@pytest.mark.parametrize(
    "messages",
    [
        [{"type": "config", "voice": "vivian", "instructions": "\ud800"}],
        [{"type": "config", "voice": "vivian"}, {"type": "text", "text": "Hi \udc00 there"}],
        [{"type": "config", "voice": "vivian", "api_key": "\ud800"}],
    ],
)
def test_lone_surrogate_on_the_websocket_is_an_error_and_4400(messages: list[dict[str, Any]]) -> None:
    async def main() -> None:
        async with Harness(http=True, frames=1) as h, connect(ws_url(h)) as ws:
            for message in messages:
                await ws.send(json.dumps(message))
            received = await read_until_closed(ws)
            assert ws.close_code == 4400
            errors = [json.loads(m) for m in received if isinstance(m, str) and '"error"' in m]
            assert errors and "not valid Unicode" in errors[-1]["error"]["message"]
            assert_clean(errors[-1]["error"]["message"])

    run(main())


def _string_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (``number``) carrying ``payload`` as it is."""
    return bytes([number << 3 | 2, len(payload)]) + payload


TEXT = tts_pb2.SynthesizeRequest.DESCRIPTOR.fields_by_name["text"].number
STREAM_TEXT = tts_pb2.StreamingSynthesizeRequest.DESCRIPTOR.fields_by_name["text"].number
VALID = tts_pb2.SynthesizeRequest(text="Hello.", speaker="vivian").SerializeToString()
CONFIG = tts_pb2.StreamingSynthesizeRequest(
    config=tts_pb2.SynthesizeRequest(speaker="vivian")
).SerializeToString()


@pytest.mark.parametrize(
    ("unary", "stream"),
    [
        (_string_field(TEXT, b"Hi \xff\xfe there"), [CONFIG, _string_field(STREAM_TEXT, b"Hi \xff\xfe")]),
        (_string_field(TEXT, b"\xed\xa0\x80"), [CONFIG, _string_field(STREAM_TEXT, b"\xed\xa0\x80")]),
        (VALID[:-2], [CONFIG[:-1]]),
    ],
    ids=["invalid-utf8", "encoded-surrogate", "truncated"],
)
def test_grpc_request_that_does_not_parse_is_invalid_argument(unary: bytes, stream: list[bytes]) -> None:
    async def main() -> None:
        async with Harness() as h:
            synthesize = h.channel.unary_stream("/qwen3tts.v1.TextToSpeech/Synthesize")
            with pytest.raises(grpc.aio.AioRpcError) as unary_failure:
                [r async for r in synthesize(unary, timeout=10)]
            streaming = h.channel.stream_stream("/qwen3tts.v1.TextToSpeech/StreamingSynthesize")
            with pytest.raises(grpc.aio.AioRpcError) as stream_failure:
                [r async for r in streaming(iter(stream), timeout=10)]
            for failure in (unary_failure.value, stream_failure.value):
                assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT, failure
                assert "does not parse" in (failure.details() or "")
                assert_clean(failure.details() or "")

    run(main())


# --- finding 3: no internals in errors -------------------------------------------------------
def test_undecodable_upload_error_names_no_python_object() -> None:
    async def main() -> None:
        async with Harness("base", http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
            response = await client.post(
                "/v1/audio/voices",
                files={"audio_sample": ("ref.wav", b"this is not audio" * 20, "audio/wav")},
                data={"name": "x", "ref_text": "Hello."},
            )
            assert response.status_code == 400, response.text
            message = response.json()["error"]["message"]
            assert "could not decode audio" in message
            assert_clean(message)

    run(main())


def test_internal_error_gives_the_request_id_not_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with Harness(http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:

            async def broken() -> Any:
                raise RuntimeError("secret detail at /work/x.py <object at 0xdeadbeef>")

            monkeypatch.setattr(h.gateway.catalog, "list_models", broken)
            response = await client.get("/v1/models", headers={"x-request-id": "req-abc"})
            assert response.status_code == 500
            message = response.json()["error"]["message"]
            assert "req-abc" in message and response.headers["x-request-id"] == "req-abc"
            assert "secret" not in message
            assert_clean(message)

    run(main())


# --- finding 6 (part): multipart text that is not UTF-8 ----------------------------------------
def test_multipart_field_that_is_not_utf8_is_400_naming_it() -> None:
    async def main() -> None:
        async with Harness("base", http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
            boundary = "b0undary"
            body = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n'.encode()
                + b"\xff\xfe"
                + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="instructions"\r\n\r\nCalm.'
                f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="text"\r\n\r\nHi.\r\n--{boundary}--\r\n'.encode()
            )
            response = await client.post(
                "/v1/audio/voices",
                content=body,
                headers={"content-type": f"multipart/form-data; boundary={boundary}"},
            )
            assert response.status_code == 400, response.text
            message = response.json()["error"]["message"]
            assert "'name'" in message and "not valid UTF-8" in message
            listing = await client.get("/v1/audio/voices")
            assert not [v for v in listing.json()["data"] if v["type"] != "preset" and v["type"] != "alias"]

    run(main())


_B = "b0undary"
_DESIGN = f'\r\n--{_B}\r\nContent-Disposition: form-data; name="instructions"\r\n\r\nCalm.\r\n--{_B}--\r\n'


def _multipart(disposition: bytes, value: bytes = b"x") -> tuple[str, bytes]:
    body = f"--{_B}\r\nContent-Disposition: form-data; ".encode() + disposition + b"\r\n\r\n" + value
    return f"multipart/form-data; boundary={_B}", body + _DESIGN.encode()


URLENCODED = "application/x-www-form-urlencoded"


FORMS_NOT_UTF8 = [
    (URLENCODED, b"name=%FF%FE&instructions=Calm.", "'name'"),  # percent-encoded bytes
    (URLENCODED, b"name=Bo&instructions=Calm+%C3", "'instructions'"),  # a cut sequence
    (URLENCODED, b"%FF=1&instructions=Calm.", "name"),  # the field's name
    (URLENCODED, b"name=\xc3\xa9&instructions=Calm.", "'name'"),  # raw (not percent-encoded)
    (*_multipart(b'name="\xff\xfe"'), "name"),  # a part's name
    (*_multipart(b'name="audio_sample"; filename="\xff.wav"', b"RIFF"), "'audio_sample'"),  # its filename
]


def test_form_bytes_that_are_not_utf8_are_400_naming_the_field() -> None:
    """Urlencoded fields and multipart part names and filenames, like multipart text fields:
    never U+FFFD, Latin-1 or mojibake, and no voice made of them. (Every cut of the body into
    chunks: test_http_forms.)"""

    async def main() -> None:
        async with Harness("base", http=True) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
            for content_type, body, named in FORMS_NOT_UTF8:
                response = await client.post(
                    "/v1/audio/voices", content=body, headers={"content-type": content_type}
                )
                assert response.status_code == 400, (body, response.text)
                message = response.json()["error"]["message"]
                assert named in message, (body, message)
                assert "not valid UTF-8" in message or "percent-encoded" in message, (body, message)
                assert_clean(message)
            listing = await client.get("/v1/audio/voices")
            assert not [v for v in listing.json()["data"] if v["type"] not in ("preset", "alias")]

    run(main())


# --- finding 4: the key before the body ------------------------------------------------------
@pytest.mark.parametrize(("headers", "status"), [({}, 401), ({"x-api-key": "wrong"}, 403)])
def test_key_is_checked_before_the_body_is_parsed(headers: dict[str, str], status: int) -> None:
    async def main() -> None:
        async with (
            Harness(http=True, api_keys=frozenset({KEY})) as h,
            httpx2.AsyncClient(base_url=h.http_url) as c,
        ):
            for method, path in [("POST", "/v1/audio/speech"), ("POST", "/v1/audio/voices/import")]:
                response = await c.request(
                    method,
                    path,
                    content=b'{"input": ',
                    headers={"content-type": "application/json", **headers},
                )
                assert response.status_code == status, (path, response.text)
            for path in ["/v1/audio/voices/voice-" + "0" * 32]:
                response = await c.patch(
                    path, content=b"\xff", headers={"content-type": "application/json", **headers}
                )
                assert response.status_code == status

    run(main())


def test_unauthenticated_upload_is_refused_without_reading_it() -> None:
    """Headers announcing a large multipart upload, a few bytes of it sent: 401 at once, and the
    connection closed (the rest is never read)."""

    async def main() -> None:
        async with Harness(http=True, api_keys=frozenset({KEY})) as h:
            port = int(h.http_url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/audio/voices HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n"
                b"Content-Type: multipart/form-data; boundary=x\r\n\r\n--x\r\n"
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 401"), head
            assert b"connection: close" in head.lower()
            await asyncio.wait_for(reader.read(), 5)  # the server closes: EOF
            writer.close()

    run(main())


# --- finding 5: the WebSocket's key at the handshake and the config deadline --------------------
def test_websocket_wrong_header_key_is_refused_before_accepting() -> None:
    async def main() -> None:
        async with Harness(http=True, frames=1, api_keys=frozenset({KEY})) as h:
            with pytest.raises(InvalidStatus) as refused:
                async with connect(ws_url(h), additional_headers={"x-api-key": "wrong"}):
                    pass
            assert refused.value.response.status_code == 403

    run(main())


def test_websocket_without_config_is_closed_with_1008_at_the_deadline() -> None:
    async def main() -> None:
        async with Harness(
            http=True, frames=1, api_keys=frozenset({KEY}), websocket_config_timeout_seconds=0.3
        ) as h:
            async with connect(ws_url(h)) as ws:
                started = asyncio.get_running_loop().time()
                await asyncio.wait_for(read_until_closed(ws), 5)
                assert ws.close_code == 1008
                assert asyncio.get_running_loop().time() - started < 3

    run(main())


# --- finding 6: framing and head limits, over a real socket -------------------------------------
async def _exchange(port: int, *pieces: bytes) -> tuple[bytes, bool]:
    """Send ``pieces`` (a pause between them); the answer's head, and whether the server then
    closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        try:
            closed = await asyncio.wait_for(reader.read(1), 1) == b""
        except TimeoutError:
            closed = False  # kept open for the next request
        return head, closed
    finally:
        writer.close()


def test_framing_and_header_limits_over_a_socket() -> None:
    async def main() -> None:
        async with Harness(http=True, http_max_headers=20, http_max_header_bytes=2048) as h:
            port = int(h.http_url.rsplit(":", 1)[1])
            body = json.dumps(speech_body()).encode()
            chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
            smuggled = (
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                + chunked
            )
            head, closed = await _exchange(port, smuggled)
            assert head.startswith(b"HTTP/1.1 400") and closed, head

            many = (
                b"GET /health HTTP/1.1\r\nHost: t\r\n"
                + b"".join(b"X-%d: 1\r\n" % i for i in range(25))
                + b"\r\n"
            )
            head, closed = await _exchange(port, many)
            assert head.startswith(b"HTTP/1.1 431") and closed, head

            big = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n"
            head, closed = await _exchange(port, big)
            assert head.startswith(b"HTTP/1.1 431") and closed, head
            # The same head arriving in pieces (the parser buffers it): 431 too.
            head, closed = await _exchange(port, big[:1000], big[1000:2500], big[2500:])
            assert head.startswith(b"HTTP/1.1 431") and closed, head

            within = (
                b"GET /health HTTP/1.1\r\nHost: t\r\n"
                + b"".join(b"X-%d: 1\r\n" % i for i in range(15))
                + b"\r\n"
            )
            head, closed = await _exchange(port, within)
            assert head.startswith(b"HTTP/1.1 200") and not closed, head

    run(main())


def test_grpc_internal_error_gives_the_request_id_not_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with Harness() as h:

            async def broken() -> Any:
                raise RuntimeError("secret detail at /work/x.py <object at 0xdeadbeef>")

            monkeypatch.setattr(h.gateway.catalog, "list_models", broken)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await h.stub.ListModels(tts_pb2.ListModelsRequest(), metadata=[("x-request-id", "req-grpc")])
            assert failure.value.code() == grpc.StatusCode.INTERNAL
            details = failure.value.details() or ""
            assert "req-grpc" in details and "secret" not in details
            assert_clean(details)

    run(main())
