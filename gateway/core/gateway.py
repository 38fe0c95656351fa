"""The gateway's transport-free core: :class:`Gateway`, one object per concern over the served
models, for the gRPC servicer and the HTTP API alike.

* :attr:`Gateway.unary` — ``Synthesize`` (:mod:`.unary`);
* :attr:`Gateway.streamed` — ``StreamingSynthesize`` (:mod:`.streamed`);
* :attr:`Gateway.voices` — registered voices: list, register (reference or design), get,
  update, export, import, delete (:mod:`.voices`, :mod:`.designs`);
* :attr:`Gateway.catalog` — model descriptions (:mod:`.catalog`);
* :attr:`Gateway.admission` — the stream places they share (:mod:`.admission`);

over :attr:`Gateway.models` (:class:`~gateway.stages.models.ModelRegistry`: each model's
stages, the shared decoder pool) and the voice library (:mod:`.library`: shared with every
gateway over the same database). Build it inside the running event loop (the stage channels bind
to it), :meth:`Gateway.start` before serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tts_common import metrics
from tts_common.serving.health import ServingHealth

from ..config import GatewayConfig
from ..stages.models import ModelRegistry, request_limits
from ..synthesis.context import SynthesisContext
from ..voice_library import VoiceLibrary
from .admission import Admission
from .catalog import ModelCatalog
from .designs import VoiceDesigner
from .library import GatewayLibrary
from .streamed import StreamedSynthesis
from .unary import UnarySynthesis
from .voices import VoiceService


class Gateway:
    """The transport-free core (see the module doc)."""

    def __init__(
        self, config: GatewayConfig, models: ModelRegistry, library: VoiceLibrary | None = None
    ) -> None:
        """``library``: a voice library made elsewhere (tests); else the one ``config`` says."""
        self.config = config
        self.models = models
        self.library_host = GatewayLibrary(config, library)
        self.library = self.library_host.library
        self.admission = Admission(config.max_concurrent_streams)
        limits = request_limits(config)
        context = SynthesisContext(config, models.decoder, self.library, limits, models.aligner)
        self.unary = UnarySynthesis(models, context, self.admission)
        self.streamed = StreamedSynthesis(models, context, self.admission)
        self.voices = VoiceService(
            models, self.library, VoiceDesigner(models, context, self.admission), limits
        )
        self.catalog = ModelCatalog(models)

    @classmethod
    def from_config(cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None) -> Gateway:
        """The core of ``config``, its stage channels created (call inside the event loop;
        ``options``: base channel options)."""
        return cls(config, ModelRegistry.from_config(config, options))

    async def start(self) -> None:
        """Start the voice library (a database that cannot answer does not hold the start back:
        :mod:`.library`) and wait for every stage (the server reports NOT_SERVING meanwhile);
        refuses models the decoder pool cannot decode."""
        await self.library_host.start()
        await self.models.start()
        for backend in self.models:
            metrics.init_model(backend.name)

    def tie_readiness(self, health: ServingHealth) -> None:
        """Readiness follows the stages (:meth:`ModelRegistry.tie_readiness`)."""
        self.models.tie_readiness(health)

    async def close(self) -> None:
        """Close the stage channels and the voice library."""
        await self.models.close()
        await self.library_host.close()


__all__ = ["Gateway"]
