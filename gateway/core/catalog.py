"""The served models as clients see them (GetModelInfo, ListModels, ``GET /v1/models``)."""

from __future__ import annotations

from tts_common.pb.qwen3tts.v1 import tts_pb2

from ..stages.backend import ModelBackend
from ..stages.models import ModelRegistry


class ModelCatalog:
    """Descriptions of the served models (see the module doc)."""

    def __init__(self, models: ModelRegistry) -> None:
        self.models = models

    async def describe(self, backend: ModelBackend) -> tts_pb2.ModelInfo:
        """One model as clients see it (voice cloning only with a speaker stage, timestamps
        only with an aligner stage)."""
        info = backend.public_info(await backend.talker_info(), is_default=backend is self.models.default)
        info.timestamps_supported = self.models.aligner is not None
        return info

    async def model_info(self, name: str) -> tts_pb2.ModelInfo:
        """The model ``name`` names ("" = the default; NOT_FOUND listing the served ones)."""
        return await self.describe(self.models.get(name))

    async def list_models(self) -> tts_pb2.ListModelsResponse:
        """Every served model, the default first."""
        default = self.models.default
        ordered = [default, *(b for b in self.models if b is not default)]
        return tts_pb2.ListModelsResponse(
            models=[await self.describe(b) for b in ordered], default_model=default.name
        )


__all__ = ["ModelCatalog"]
