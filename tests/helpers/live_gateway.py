"""A :class:`~tests.helpers.fake_stages.Harness` served from its own thread, for synchronous
clients (schemathesis, hypothesis tests with blocking HTTP, WebSocket and gRPC clients)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tests.helpers.fake_stages import Harness


class LiveGateway:
    """A :class:`Harness` (HTTP on) served from its own thread's event loop, for synchronous
    clients."""

    def __init__(self, **config: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-gateway", daemon=True)
        self.harness = Harness(http=True, frames=2, delay=0.0, **config)

    def __enter__(self) -> Harness:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.harness.__aenter__(), self.loop).result(30)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.harness.__aexit__(None, None, None), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
