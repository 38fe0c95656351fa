"""The one check of request text, on every surface: a text field must be valid Unicode that
UTF-8 can carry (no lone surrogate, which a JSON ``\\ud800`` escape can smuggle in; no invalid
UTF-8 bytes, which a multipart field can carry), else INVALID_ARGUMENT naming the field.

Used by the HTTP bodies (every string of every pydantic body, :mod:`.http.schemas`), the
multipart fields of a voice upload (:func:`decode_text`), the WebSocket's ``text`` messages and
``config``, and the gRPC API, where a string field that is not UTF-8 makes the whole message fail
to parse (:mod:`.grpc_parsing`, which answers that INVALID_ARGUMENT too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tts_common.errors import InvalidRequestError


def text_problem(value: object, path: str = "") -> str | None:
    """Why ``value`` is not valid text (None: it is): a string, or the keys and values of nested
    JSON objects and arrays; ``path`` names it in the answer (e.g. ``labels.lang: ...``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            why = f"not valid Unicode text (a lone surrogate at character {exc.start})"
            return f"{path}: {why}" if path else why
    elif isinstance(value, Mapping):
        for key, item in value.items():
            problem = text_problem(key, f"{path} (a key)" if path else "a key")
            if problem is None:
                problem = text_problem(item, f"{path}.{key}" if path else str(key))
            if problem is not None:
                return problem
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for index, item in enumerate(value):
            problem = text_problem(item, f"{path}.{index}" if path else str(index))
            if problem is not None:
                return problem
    return None


def check_text(value: object, field: str) -> None:
    """INVALID_ARGUMENT naming ``field`` unless ``value`` is valid text (:func:`text_problem`)."""
    problem = text_problem(value, field)
    if problem is not None:
        raise InvalidRequestError(problem)


def decode_text(raw: bytes | bytearray, field: str) -> str:
    """``raw`` as UTF-8 text; INVALID_ARGUMENT naming ``field`` if it is not UTF-8."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{field}: not valid UTF-8 (at byte {exc.start})") from None


__all__ = ["check_text", "decode_text", "text_problem"]
