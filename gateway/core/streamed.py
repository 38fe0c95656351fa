"""``StreamingSynthesize``, for any transport: text deltas in as they are written, one response
stream out (:mod:`gateway.synthesis.session` runs the stream once its configuration is
accepted).

The configuration's model (NOT_FOUND listing the served ones) -> what this gateway can never
serve refused (:meth:`~gateway.synthesis.context.SynthesisContext.check_request`) -> admission
-> the configuration validated against that model and its voice resolved -> a
:class:`StreamingSession` given the utterance sequence, the response builder, the utterance cutter and (``timestamps``) the
timestamper it works with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from tts_common import metrics
from tts_common.logging_setup import model_context
from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..config import STAGE
from ..stages.models import ModelRegistry
from ..synthesis.context import SynthesisContext
from ..synthesis.session import StreamingSession
from ..synthesis.text_cutter import UtteranceCutter
from ..voice_library import Caller
from .admission import Admission


@dataclass(frozen=True)
class StreamedSynthesis:
    """``StreamingSynthesize`` over the served models (see the module doc)."""

    models: ModelRegistry
    context: SynthesisContext
    admission: Admission

    async def synthesize(
        self,
        config: tts_pb2.SynthesizeRequest,
        messages: AsyncIterator[tts_pb2.StreamingSynthesizeRequest],
        request_id: str,
        *,
        caller: Caller,
        received: float,
        time_remaining: float | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """The response stream of one StreamingSynthesize call made by ``caller``: ``config``
        is its first message (``gateway.synthesis.text_cutter.read_config``), ``messages`` the
        rest (text, flush, cancel) until the client's half-close."""
        backend = self.models.get(config.model)
        timestamps = self.context.check_request(config)
        with model_context(backend.name), self.admission.admit(received, backend):
            metrics.TEXT_STREAMS.labels(stage=STAGE).inc()
            try:
                context = self.context
                prepared = await context.prepare(
                    backend, config, request_id, time_remaining, caller=caller, streamed_text=True
                )
                builder = prepared.responses(request_id, received, speed)
                session = StreamingSession(
                    prepared,
                    messages,
                    request_id,
                    sequence=context.sequence(backend, prepared, time_remaining),
                    responses=builder,
                    cutter=UtteranceCutter(*context.segment_size(backend, prepared)),
                    max_text_chars=context.config.max_text_chars,
                    idle_timeout=context.config.text_idle_timeout_seconds,
                    timestamps=lambda queue: (
                        context.timestamper(config, prepared, builder, queue, request_id, time_remaining)
                        if timestamps
                        else None
                    ),
                )
                async for response in session.responses():
                    yield response
            finally:
                metrics.TEXT_STREAMS.labels(stage=STAGE).dec()


__all__ = ["StreamedSynthesis"]
