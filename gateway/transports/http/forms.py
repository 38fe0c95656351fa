"""Multipart forms whose text fields must be UTF-8: Starlette decodes a field that is not as
Latin-1 without a word (a voice named ``ÿþ``); here such a field is 400 naming it, by the one
text check (:func:`gateway.transports.text.decode_text`). A route opts in with
``route_class=Utf8FormRoute``."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import aclosing
from typing import Any

from fastapi.routing import APIRoute
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response

from tts_common.errors import InvalidRequestError

from ..text import decode_text

MULTIPART = "multipart/form-data"


class Utf8MultiPartParser(MultiPartParser):
    """Starlette's parser, but a text field that is not UTF-8 is refused, not re-read as Latin-1."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            decode_text(part.data, f"form field {part.field_name!r}")
        super().on_part_end()


class Utf8FormRequest(Request):
    """A request whose multipart form is parsed by :class:`Utf8MultiPartParser`."""

    async def form(  # type: ignore[override]
        self,
        *,
        max_files: int | float = 1000,
        max_fields: int | float = 1000,
        max_part_size: int = 1024 * 1024,
    ) -> FormData:
        content_type = self.headers.get("content-type", "")
        if self._form is None and content_type.split(";")[0].strip().lower() == MULTIPART:
            try:
                async with aclosing(self.stream()) as stream:
                    parser = Utf8MultiPartParser(
                        self.headers,
                        stream,
                        max_files=max_files,
                        max_fields=max_fields,
                        max_part_size=max_part_size,
                    )
                    self._form = await parser.parse()
            except MultiPartException as exc:
                raise HTTPException(400, exc.message) from None
            except InvalidRequestError as exc:
                # An HTTPException passes FastAPI's body parsing unchanged (anything else there
                # becomes a generic 400 without the field's name).
                raise HTTPException(400, str(exc)) from None
        return await super().form(max_files=max_files, max_fields=max_fields, max_part_size=max_part_size)


class Utf8FormRoute(APIRoute):
    """An ``APIRoute`` whose handler sees a :class:`Utf8FormRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(Utf8FormRequest(request.scope, request.receive))

        return handle


__all__ = ["Utf8FormRequest", "Utf8FormRoute", "Utf8MultiPartParser"]
