"""``/openapi.json`` is a valid OpenAPI document that describes the routes as they behave: the
speech route's audio media types and server-sent events, OpenAI's error body on every error
status of every route (never FastAPI's 422), and the API-key scheme where keys are configured.
(The live server's conformance to it is checked by schemathesis: tests/integration.)"""

from __future__ import annotations

import re
from typing import Any

import httpx2
import pytest
from openapi_spec_validator import validate

from gateway.transports.http.formats import RESPONSE_FORMATS, SSE_MEDIA_TYPE
from tests.helpers.fake_stages import Harness, run


async def _document(**config: Any) -> tuple[dict[str, Any], str]:
    async with Harness(http=True, **config) as h, httpx2.AsyncClient(base_url=h.http_url) as client:
        spec = await client.get("/openapi.json")
        assert spec.status_code == 200, spec.text
        docs = await client.get("/docs")
        assert docs.status_code == 200
        return spec.json(), docs.text


def test_docs_page_loads_swagger_ui_from_this_server_alone() -> None:
    """``/docs`` works air-gapped: every script, style sheet and icon it loads is served by the
    gateway itself (with keys configured too: the page is not behind them), none from a CDN.
    (tests/integration/test_playground_browser.py renders it in Chromium.)"""

    async def main() -> None:
        async with (
            Harness(http=True, api_keys=frozenset({"k1"})) as h,
            httpx2.AsyncClient(base_url=h.http_url) as client,
        ):
            page = (await client.get("/docs")).text
            assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
            assert len(assets) >= 3 and any(a.endswith(".js") for a in assets), page
            for asset in assets:
                assert asset.startswith("/") and not asset.startswith("//"), asset  # this server
                response = await client.get(asset)
                assert response.status_code == 200 and response.content, asset

    run(main())


@pytest.mark.parametrize("keys", [False, True])
def test_openapi_document_is_valid_and_describes_the_routes(keys: bool) -> None:
    config: dict[str, Any] = {"api_keys": frozenset({"k1"})} if keys else {}
    document, docs = run(_document(**config))
    validate(document)  # raises on an invalid document
    assert "/openapi.json" in docs  # Swagger UI renders this document

    paths = document["paths"]
    assert {"/v1/audio/speech", "/v1/models", "/v1/models/{model_id}", "/v1/audio/voices"} <= set(paths)
    speech = paths["/v1/audio/speech"]["post"]
    content = speech["responses"]["200"]["content"]
    assert {f.media_type for f in RESPONSE_FORMATS.values()} | {SSE_MEDIA_TYPE, "application/json"} == set(
        content
    )
    assert content["application/json"]["schema"]["$ref"].endswith("/SpeechJsonBody")
    assert content[SSE_MEDIA_TYPE]["x-event-schema"]["$ref"].endswith("/SpeechStreamEvent")
    events = document["components"]["schemas"]["SpeechStreamEvent"]
    assert set(events["discriminator"]["mapping"]) == {
        "speech.audio.delta",
        "speech.audio.timestamps",
        "speech.audio.done",
        "error",
    }

    error_ref = "#/components/schemas/ErrorBody"
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, (method, path)  # bad parameters are 400 here
            if path.startswith("/v1/"):
                for status in ("400", "401", "403", "404", "413", "429", "431", "500", "503", "default"):
                    schema = responses[status]["content"]["application/json"]["schema"]
                    assert schema == {"$ref": error_ref}, (method, path, status)
                assert (operation.get("security") is not None) == keys, (method, path)
    assert ("securitySchemes" in document["components"]) == keys
