"""The gateway's OpenAI-compatible HTTP API and browser playground (FastAPI on uvicorn, in the
gateway process and on its event loop): :class:`~.server.HttpServer` (the listener),
:func:`~.app.create_app` (the routes), :mod:`.speech` (an OpenAI body as a ``SynthesizeRequest``),
:mod:`.errors` (exceptions to HTTP statuses and OpenAI error objects), :mod:`.streaming` (audio
and server-sent events, cancellation), :mod:`.limits` (413), ``static/playground.html``."""

from .app import HttpApi, create_app
from .server import HttpServer

__all__ = ["HttpApi", "HttpServer", "create_app"]
