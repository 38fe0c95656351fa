"""Admission: at most ``max_concurrent_streams`` synthesis streams at once over every model
(RESOURCE_EXHAUSTED at once beyond it), and what each stream's end records."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import grpc

from tts_common import metrics
from tts_common.errors import CapacityError
from tts_common.serving.rpc_errors import grpc_status_for

from ..config import STAGE
from ..stages.backend import ModelBackend
from ..stages.errors import StageError


class Admission:
    """The gateway's stream places (see the module doc)."""

    def __init__(self, max_concurrent_streams: int) -> None:
        self.limit = max_concurrent_streams
        self.active = 0
        """Streams running now."""
        self._per_model: dict[str, int] = {}

    @contextlib.contextmanager
    def admit(self, received: float, model: ModelBackend) -> Iterator[None]:
        """One stream's place for ``model`` (RESOURCE_EXHAUSTED at once when the server is at
        capacity), for Synthesize, StreamingSynthesize and voice design alike; an admitted
        stream's duration since ``received`` and its final status are recorded when it ends. A
        stream that fails with the model's talker unavailable makes the next request re-fetch its
        model info (a restarted or replaced talker may report other info)."""
        if self.active >= self.limit:
            raise CapacityError(
                f"server at capacity ({self.limit} concurrent Synthesize streams); retry later"
            )
        name = model.name
        self._count(name, +1)
        status = grpc.StatusCode.OK
        try:
            yield
        except GeneratorExit:  # the response stream was closed: the client went away
            status = grpc.StatusCode.CANCELLED
            raise
        except BaseException as exc:
            status = grpc_status_for(exc)
            if (
                isinstance(exc, StageError)
                and exc.stage == "talker"
                and exc.code is grpc.StatusCode.UNAVAILABLE
            ):
                model.info.invalidate()
            raise
        finally:
            self._count(name, -1)
            metrics.REQUEST_DURATION.labels(stage=STAGE).observe(time.monotonic() - received)
            metrics.MODEL_STREAMS.labels(stage=STAGE, model=name, status=status.name).inc()

    def _count(self, model: str, delta: int) -> None:
        self.active += delta
        self._per_model[model] = self._per_model.get(model, 0) + delta
        metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active)
        metrics.MODEL_RUNNING_STREAMS.labels(stage=STAGE, model=model).set(self._per_model[model])


__all__ = ["Admission"]
