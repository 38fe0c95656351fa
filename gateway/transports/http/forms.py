"""Form bodies whose text must be UTF-8. Starlette decodes what is not: a multipart text field,
part name or filename as Latin-1 (a voice named ``ÿþ``), an urlencoded field's percent-escapes
to U+FFFD and its raw bytes as Latin-1, all without a word. Here any of them is 400 naming the
field, by the one text check (:func:`gateway.transports.text.decode_text`).

The body is checked as it streams past Starlette's parser, by python-multipart's own parsers
(the ones Starlette uses) fed the same chunks, so nothing is buffered twice and only public API
is used: the ASGI ``receive`` the request reads from is wrapped. A route opts in with
``route_class=Utf8FormRoute``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi.routing import APIRoute
from python_multipart import MultipartParser, QuerystringParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from tts_common.errors import InvalidRequestError

from ..text import decode_text

MULTIPART = b"multipart/form-data"
URLENCODED = b"application/x-www-form-urlencoded"


class _MultipartCheck:
    """Every part's name and filename, and every text part's bytes, must be UTF-8."""

    def __init__(self, boundary: bytes) -> None:
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._field: str | None = None  # the text part being read (None: a file, or none)
        self._data = bytearray()
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
                "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def _begin(self) -> None:
        self._disposition, self._field = b"", None
        self._data.clear()

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            return  # Starlette refuses it, in its words
        name = decode_text(options[b"name"], "a form field's name")
        if b"filename" in options:
            decode_text(options[b"filename"], f"form field {name!r}: its filename")
        else:
            self._field = name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        # Bounded: Starlette reads the same chunk next, and refuses a text part over its limit.
        if self._field is not None:
            self._data.extend(data[start:end])

    def _part_end(self) -> None:
        if self._field is not None:
            decode_text(self._data, f"form field {self._field!r}")


class _UrlencodedCheck:
    """Every field's name and value, percent-decoded, must be UTF-8; a raw byte beyond ASCII
    (which Starlette would read as Latin-1) must be percent-encoded."""

    def __init__(self) -> None:
        self._name = bytearray()
        self._value = bytearray()
        self.parser = QuerystringParser(
            {
                "on_field_start": self._start,
                "on_field_name": lambda data, start, end: self._name.extend(data[start:end]),
                "on_field_data": lambda data, start, end: self._value.extend(data[start:end]),
                "on_field_end": self._end,
            }
        )

    def _start(self) -> None:
        self._name.clear()
        self._value.clear()

    def _end(self) -> None:
        name = self._decode(self._name, "a form field's name")
        self._decode(self._value, f"form field {name!r}")

    @staticmethod
    def _decode(raw: bytearray, field: str) -> str:
        if not raw.isascii():
            raise InvalidRequestError(f"{field}: bytes beyond ASCII must be percent-encoded (as UTF-8)")
        return decode_text(unquote_to_bytes(bytes(raw).replace(b"+", b" ")), field)


def checked_receive(receive: Receive, content_type: str) -> Receive:
    """``receive``, with each body chunk of a form (``content_type``) checked before it is
    passed on: HTTPException 400 naming the first field that is not UTF-8 (an HTTPException
    passes FastAPI's body parsing unchanged; anything else there becomes a generic 400 without
    the field's name). Other bodies, and forms that do not parse, pass unchecked (Starlette
    answers those)."""
    kind, options = parse_options_header(content_type)
    if kind == MULTIPART and options.get(b"boundary"):
        check: _MultipartCheck | _UrlencodedCheck = _MultipartCheck(options[b"boundary"])
    elif kind == URLENCODED:
        check = _UrlencodedCheck()
    else:
        return receive
    parser: MultipartParser | QuerystringParser | None = check.parser

    async def receive_checked() -> Message:
        nonlocal parser
        message = await receive()
        if parser is None or message["type"] != "http.request":
            return message
        try:
            parser.write(message.get("body", b""))
            if not message.get("more_body", False):
                parser.finalize()
        except InvalidRequestError as exc:
            raise HTTPException(400, str(exc)) from None
        except FormParserError:
            parser = None  # malformed: Starlette's parser says so
        return message

    return receive_checked


class Utf8FormRoute(APIRoute):
    """An ``APIRoute`` whose form bodies are checked as they are read (:func:`checked_receive`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            content_type = request.headers.get("content-type", "")
            return await handler(Request(request.scope, checked_receive(request.receive, content_type)))

        return handle


__all__ = ["Utf8FormRoute", "checked_receive"]
