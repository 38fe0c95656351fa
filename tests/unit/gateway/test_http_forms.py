"""The form check (gateway.transports.http.forms) on its own, however the body is cut into
chunks: a form whose names, filenames and text are UTF-8 passes through unchanged; one byte
that is not UTF-8 in any of them is 400 naming the field. (Over HTTP: test_http_hardening.)"""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.exceptions import HTTPException
from starlette.types import Message

from gateway.transports.http.forms import checked_receive

BOUNDARY = "xYzZY"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
URLENCODED = "application/x-www-form-urlencoded"

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_names = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters='"\\\r\n'), min_size=1, max_size=8
)
FIELDS = st.dictionaries(_names, _text, min_size=1, max_size=4)


def multipart(fields: dict[str, str], filename: bytes | None = None) -> bytes:
    body = b""
    for name, value in fields.items():
        body += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value.encode()
        )
        body += b"\r\n"
    if filename is not None:
        body += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="upload"; filename="'.encode()
        body += filename + b'"\r\nContent-Type: audio/wav\r\n\r\n\xff\xfe\x00RIFF\r\n'
    return body + f"--{BOUNDARY}--\r\n".encode()


def read_all(body: bytes, cuts: list[int], content_type: str) -> list[Message]:
    """The messages ``checked_receive`` passes on, the body sent in chunks cut at ``cuts``."""
    points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    chunks = [body[a:b] for a, b in zip(points, points[1:], strict=False)] or [b""]
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    pending = iter(messages)

    async def receive() -> Message:
        return next(pending)

    async def main() -> list[Message]:
        checked = checked_receive(receive, content_type)
        return [await checked() for _ in messages]

    passed = asyncio.run(main())
    assert passed == messages  # unchanged
    return passed


CUTS = st.lists(st.integers(0, 400), max_size=6)


@given(fields=FIELDS, cuts=CUTS, filename=st.one_of(st.none(), _names.map(str.encode)))
def test_utf8_forms_pass_unchanged(fields: dict[str, str], cuts: list[int], filename: bytes | None) -> None:
    read_all(multipart(fields, filename), cuts, MULTIPART)
    read_all(urlencode(fields).encode(), cuts, URLENCODED)


@given(fields=FIELDS, cuts=CUTS, where=st.sampled_from(["name", "value", "filename"]), data=st.data())
def test_one_byte_that_is_not_utf8_is_400_naming_the_field(
    fields: dict[str, str], cuts: list[int], where: str, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(fields)))
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"]))  # never UTF-8; cut; a surrogate
    raw = {k: v.encode() for k, v in fields.items()}
    filename = b"a.wav"
    if where == "value":
        raw[name] += bad
    elif where == "filename":
        filename = b"a" + bad + b".wav"
    body = b""
    for key, value in raw.items():
        head = key.encode() + (bad if where == "name" and key == name else b"")
        body += (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="'.encode() + head + b'"\r\n\r\n' + value
        )
        body += b"\r\n"
    body += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="upload"; filename="'.encode() + filename
    body += f'"\r\n\r\nRIFF\r\n--{BOUNDARY}--\r\n'.encode()
    with pytest.raises(HTTPException) as refused:
        read_all(body, cuts, MULTIPART)
    assert refused.value.status_code == 400 and "not valid UTF-8" in refused.value.detail
    named = {"name": "a form field's name", "value": repr(name), "filename": "'upload': its filename"}[where]
    assert named in refused.value.detail

    encoded = {k: urlencode({k: v}).encode().split(b"=", 1) for k, v in raw.items() if where != "filename"}
    if encoded:
        percent = "".join(f"%{b:02X}" for b in bad).encode()
        pairs = [
            (k + percent if where == "name" and key == name else k)
            + b"="
            + (v + percent if where == "value" and key == name else v)
            for key, (k, v) in encoded.items()
        ]
        with pytest.raises(HTTPException) as refused:
            read_all(b"&".join(pairs), cuts, URLENCODED)
        assert "not valid UTF-8" in refused.value.detail and named in refused.value.detail


def test_a_form_that_does_not_parse_is_left_to_starlette() -> None:
    read_all(b"--nope\r\n garbage", [3], MULTIPART)
    read_all(b"whatever", [], "application/json")
