"""The gateway's transport-free core: :class:`Gateway`, one object per concern over the served
models, for the gRPC servicer and the HTTP API alike.

* :attr:`Gateway.unary` — ``Synthesize`` (:mod:`.unary`);
* :attr:`Gateway.streamed` — ``StreamingSynthesize`` (:mod:`.streamed`);
* :attr:`Gateway.voices` — registered voices: list, register (reference or design), delete
  (:mod:`.voices`);
* :attr:`Gateway.catalog` — model descriptions (:mod:`.catalog`);
* :attr:`Gateway.admission` — the stream places they share (:mod:`.admission`);

over :attr:`Gateway.models` (:class:`~gateway.stages.models.ModelRegistry`: each model's
stages, the shared decoder pool) and the voice store. Build it inside the running event loop
(the stage channels bind to it), :meth:`Gateway.start` before serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tts_common import metrics
from tts_common.serving.health import ServingHealth

from ..config import GatewayConfig
from ..stages.models import ModelRegistry, request_limits
from ..synthesis.context import SynthesisContext
from ..voices.files import FileVoiceStore
from ..voices.store import VoiceStore
from .admission import Admission
from .catalog import ModelCatalog
from .streamed import StreamedSynthesis
from .unary import UnarySynthesis
from .voices import VoiceService


class Gateway:
    """The transport-free core (see the module doc)."""

    def __init__(self, config: GatewayConfig, models: ModelRegistry, store: VoiceStore | None = None) -> None:
        self.config = config
        self.models = models
        self.store: VoiceStore = (
            store if store is not None else FileVoiceStore(config.voices_dir, config.max_voices)
        )
        self.admission = Admission(config.max_concurrent_streams)
        context = SynthesisContext(config, models.decoder, self.store, request_limits(config))
        self.unary = UnarySynthesis(models, context, self.admission)
        self.streamed = StreamedSynthesis(models, context, self.admission)
        self.voices = VoiceService(models, self.store, context, self.admission)
        self.catalog = ModelCatalog(models)

    @classmethod
    def from_config(cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None) -> Gateway:
        """The core of ``config``, its stage channels created (call inside the event loop;
        ``options``: base channel options)."""
        return cls(config, ModelRegistry.from_config(config, options))

    async def start(self) -> None:
        """Open the voice store and wait for every stage (the server reports NOT_SERVING
        meanwhile); refuses models the decoder pool cannot decode."""
        await self.store.load()
        await self.models.start()
        for backend in self.models:
            metrics.init_model(backend.name)

    def tie_readiness(self, health: ServingHealth) -> None:
        """Readiness follows the stages (:meth:`ModelRegistry.tie_readiness`)."""
        self.models.tie_readiness(health)

    async def close(self) -> None:
        """Close the stage channels and the voice store."""
        await self.models.close()
        await self.store.close()


__all__ = ["Gateway"]
