"""The HTTP API's OpenAPI document (``/openapi.json``, rendered by ``/docs``) as the routes behave:
FastAPI describes the routes and their JSON bodies; this module adds what it cannot infer:

* ``POST /v1/audio/speech``'s answers: the audio in each ``response_format``'s media type,
  ``text/event-stream`` whose events are :data:`SpeechEvent` (its JSON schema in the components),
  or ``application/json`` (``stream_format`` ``json``): :class:`SpeechJsonBody`;
* the error body (:class:`~.errors.ErrorBody`) on every status a route can answer
  (:func:`~.errors.error_responses`, given to the routes), in place of FastAPI's 422, which this
  API never answers (bad parameters are 400, as OpenAI's);
* the API-key scheme (``authorization: Bearer KEY`` or ``x-api-key: KEY``) on every ``/v1``
  route, where keys are configured.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter

from .errors import ErrorObject
from .formats import RESPONSE_FORMATS, SSE_MEDIA_TYPE

SPEECH_PATH = "/v1/audio/speech"


class SpeechAudioDelta(BaseModel):
    """A chunk of the audio, base64, in the requested ``response_format``."""

    type: Literal["speech.audio.delta"]
    audio: str = Field(description="Base64 of the chunk's encoded bytes.")


class SpeechAudioDone(BaseModel):
    """The end of the audio, with the synthesis summary."""

    type: Literal["speech.audio.done"]
    summary: dict[str, Any] = Field(
        description="SynthesisSummary: frames, audio seconds, time to first audio, RTF, finish reason..."
    )


class TimedUnit(BaseModel):
    """One word (or character) of the input and when it is heard."""

    text: str = Field(description="The unit as the aligner read it (letters, digits, apostrophes).")
    start: float = Field(
        description="Seconds of the audio as sent (after speed and resampling) from its start."
    )
    end: float = Field(
        description="Seconds of the audio as sent; start <= end, non-decreasing over the units."
    )
    char_start: int = Field(
        description="Its span of the input, in Unicode code points: [char_start, char_end)."
    )
    char_end: int


class SpeechAudioTimestamps(BaseModel):
    """One utterance's timings (``timestamps`` asked for), as soon as known, between the deltas."""

    type: Literal["speech.audio.timestamps"]
    index: int = Field(description="The utterance (segment) they belong to, from 0.")
    words: list[TimedUnit] | None = Field(None, description='timestamps "word": its words, in order.')
    characters: list[TimedUnit] | None = Field(
        None, description='timestamps "character": its letters and digits.'
    )
    error: str | None = Field(
        None, description="Why it has no units (the aligner failed); the audio is unaffected."
    )


class SpeechJsonBody(BaseModel):
    """``stream_format`` ``json``: the whole synthesis in one body, once everything is spoken."""

    audio: str = Field(description="Base64 of the audio in the requested response_format.")
    sample_rate: int
    request_id: str
    words: list[TimedUnit] | None = Field(None, description='timestamps "word": every word, in order.')
    characters: list[TimedUnit] | None = Field(
        None, description='timestamps "character": every letter and digit.'
    )
    timestamps_errors: dict[str, str] | None = Field(
        None, description="With timestamps: segment index -> why it has no units (empty when all have)."
    )
    summary: dict[str, Any] = Field(description="SynthesisSummary (as in speech.audio.done).")


SPEECH_JSON_SCHEMA = "SpeechJsonBody"


class SpeechStreamError(BaseModel):
    """A failure after the stream started (the stream then ends)."""

    type: Literal["error"]
    error: ErrorObject


SpeechEvent = Annotated[
    SpeechAudioDelta | SpeechAudioTimestamps | SpeechAudioDone | SpeechStreamError,
    Field(discriminator="type"),
]
"""One server-sent event of ``stream_format: "sse"`` (each ``data:`` line is one, as JSON)."""

SPEECH_EVENT_SCHEMA = "SpeechStreamEvent"


def speech_responses() -> dict[int | str, dict[str, Any]]:
    """The 200 answer of ``POST /v1/audio/speech``: each audio media type, and the events."""
    audio = {"type": "string", "format": "binary"}
    content: dict[str, Any] = {}
    for fmt in RESPONSE_FORMATS.values():
        entry = content.setdefault(fmt.media_type, {"schema": audio, "x-response-formats": []})
        entry["x-response-formats"].append(fmt.name)
    content[SSE_MEDIA_TYPE] = {
        "schema": {
            "type": "string",
            "description": 'stream_format "sse": server-sent events, each `data:` line one JSON '
            f"{SPEECH_EVENT_SCHEMA}",
        },
        "x-event-schema": {"$ref": f"#/components/schemas/{SPEECH_EVENT_SCHEMA}"},
    }
    content["application/json"] = {"schema": {"$ref": f"#/components/schemas/{SPEECH_JSON_SCHEMA}"}}
    return {
        200: {
            "description": "The audio, streamed as it is made (chunked), in the response_format's media "
            'type; or, with stream_format "sse", server-sent events; or, with stream_format "json", one '
            "JSON body (the audio in base64, its timestamps, the summary).",
            "content": content,
        }
    }


API_KEY_SCHEMES: dict[str, dict[str, str]] = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "authorization: Bearer KEY"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}


def install_openapi(app: FastAPI, *, keys: bool) -> None:
    """Serve the document described in the module doc (``keys``: API keys are configured)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        event_schema = TypeAdapter(SpeechEvent).json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(event_schema.pop("$defs", {}))
        schemas[SPEECH_EVENT_SCHEMA] = event_schema
        body_schema = SpeechJsonBody.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(body_schema.pop("$defs", {}))
        schemas[SPEECH_JSON_SCHEMA] = body_schema
        # FastAPI's own validation error schemas: never answered (400 is ErrorBody).
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        if keys:
            document["components"]["securitySchemes"] = API_KEY_SCHEMES
            for path, operations in document["paths"].items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{name: []} for name in API_KEY_SCHEMES]
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = [
    "SPEECH_EVENT_SCHEMA",
    "SPEECH_JSON_SCHEMA",
    "SpeechAudioDelta",
    "SpeechAudioDone",
    "SpeechAudioTimestamps",
    "SpeechJsonBody",
    "SpeechEvent",
    "SpeechStreamError",
    "TimedUnit",
    "install_openapi",
    "speech_responses",
]
