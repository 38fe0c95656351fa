"""Client request ids: accepted exactly when they follow the documented rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_common.errors import InvalidRequestError
from tts_common.serving.request_ids import check_request_id, resolve_request_id

ALLOWED = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@+=~"


@given(
    st.one_of(
        st.text(max_size=140),
        st.text(alphabet=ALLOWED, min_size=1, max_size=140),
        st.text(alphabet=ALLOWED + " \n\t\x00é", min_size=1, max_size=20),
    )
)
def test_accepted_iff_short_and_in_the_alphabet(value: str) -> None:
    acceptable = 0 < len(value) <= 128 and all(c in ALLOWED for c in value)
    if acceptable:
        assert check_request_id(value) == value
    else:
        with pytest.raises(InvalidRequestError, match="request_id"):
            check_request_id(value)


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata


def test_field_then_metadata_then_new() -> None:
    assert resolve_request_id("abc", _Context([("x-request-id", "ignored")])) == "abc"
    assert resolve_request_id("", _Context([("x-request-id", "from-meta")])) == "from-meta"
    assert len(resolve_request_id("", _Context([]))) == 32
    with pytest.raises(
        InvalidRequestError, match=r"x-request-id metadata is too long: 129 characters \(maximum 128\)"
    ):
        resolve_request_id("", _Context([("x-request-id", "a" * 129)]))
    with pytest.raises(InvalidRequestError, match=r"request_id 'a\\nb' has characters outside"):
        resolve_request_id("a\nb")
