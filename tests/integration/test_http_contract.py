"""The HTTP API against its own OpenAPI document, by schemathesis, on the live server (the real
gateway and uvicorn over fake stages, API keys on): every operation's generated requests, valid
and invalid, must get no server error, a documented status and a body that conforms to the
document; every error body must be OpenAI's error object and name no internals. Bounded (a few
examples per operation) to keep the suite fast; a drift between a route and its description
fails it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.live_gateway import LiveGateway

KEY = "contract-key"
AUTH = {"authorization": f"Bearer {KEY}"}
INTERNALS = re.compile(r"Error\b|Exception|Traceback|<[^>]* at 0x|0x[0-9a-f]{6,}|codec|\.py\b|class '")
ERROR_FIELDS = {"message", "type", "param", "code"}
MAX_EXAMPLES = 5
"""Per operation and generation mode: the whole file runs in seconds."""


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    with LiveGateway(api_keys=frozenset({KEY})) as h:
        yield h.http_url


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error answer is ``{"error": {"message", "type", "param", "code"}}`` and its message
    names no internals (exception names, reprs, addresses, paths)."""
    if response.status_code < 400:
        return None
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and set(error) == ERROR_FIELDS, f"not OpenAI's error object: {body}"
    assert (
        isinstance(error["message"], str)
        and isinstance(error["type"], str)
        and isinstance(error["code"], str)
    )
    assert error["param"] is None or isinstance(error["param"], str)
    assert not INTERNALS.search(error["message"]), f"internals in an error: {error['message']}"
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    openai_error_shape,
]


@pytest.fixture(scope="module")
def api_schema(live_url: str) -> Any:
    return schemathesis.openapi.from_url(live_url + "/openapi.json")


OPERATIONS = [
    ("POST", "/v1/audio/speech"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/audio/voices"),
    ("POST", "/v1/audio/voices"),
    ("POST", "/v1/audio/voices/import"),
    ("GET", "/v1/audio/voices/{voice_id}"),
    ("PATCH", "/v1/audio/voices/{voice_id}"),
    ("DELETE", "/v1/audio/voices/{voice_id}"),
    ("GET", "/v1/audio/voices/{voice_id}/export"),
    ("GET", "/health"),
]


def test_every_route_is_tested(api_schema: Any) -> None:
    """The list below is the document's: a new route is contract-tested too."""
    described = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert described == set(OPERATIONS)


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [
        (method, path, mode)
        for method, path in OPERATIONS
        for mode in GenerationMode
        if (path, mode) != ("/health", GenerationMode.NEGATIVE)  # nothing in it to break
    ],
)
def test_route_conforms_to_the_openapi_document(
    api_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=AUTH, checks=CHECKS, timeout=10)

    check()
