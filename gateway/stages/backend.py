"""One served model as the gateway's core sees it: :class:`ModelBackend`, its talker replicas,
its speaker stage when it can clone, its model info and its tokenizer. The decoder pool is shared
by every model (:class:`gateway.stages.models.ModelRegistry` holds it)."""

from __future__ import annotations

import logging

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import effective_model_info, model_label

from .model_info import REFRESH_TIMEOUT_S, TalkerInfoCache
from .routing import StageClient
from .speaker import SpeakerStage
from .tokens import TalkerTokenCounter

logger = logging.getLogger(__name__)


def voice_family(talker: stages_pb2.TalkerInfo) -> str:
    """The family of registered voices a talker speaks: its model size for a Base model (its
    x-vector has that talker's width), "" for models that take no registered voice."""
    model = talker.model
    if model.model_type != "base" and not model.voice_clone_supported:
        return ""
    return model.model_size or f"x{talker.speaker_embedding_dim}"


class ModelBackend:
    """The stages of one served model (see the module doc)."""

    def __init__(
        self,
        name: str | None,
        talker: StageClient[stages_pb2_grpc.TalkerStub],
        speaker: SpeakerStage | None,
        *,
        info_ttl_seconds: float,
        stage_timeout_seconds: float,
        health_check_interval: float = 1.0,
        health_check_timeout: float = 2.0,
    ) -> None:
        """``name``: the served name, or None for the name the talker reports (its checkpoint
        directory's), learnt at :meth:`start`; ``health_check_*``: how often, and with which
        deadline, its replicas are checked once started."""
        self._name = name
        self._health = (health_check_interval, health_check_timeout)
        self.talker = talker
        self.speaker = speaker
        self.info = TalkerInfoCache(
            talker,
            ttl_seconds=info_ttl_seconds,
            refresh_timeout_seconds=min(REFRESH_TIMEOUT_S, stage_timeout_seconds),
        )
        self.tokens = TalkerTokenCounter(
            talker, timeout_seconds=stage_timeout_seconds, retry_seconds=info_ttl_seconds
        )

    @property
    def name(self) -> str:
        """The name requests choose this model by ("" until a talker-named model has started)."""
        return self._name or ""

    @property
    def stage_clients(self) -> tuple[StageClient[object], ...]:
        """The clients of its own stages (talker, speaker)."""
        clients: list[StageClient[object]] = [self.talker]  # type: ignore[list-item]
        if self.speaker is not None:
            clients.append(self.speaker.client)  # type: ignore[arg-type]
        return tuple(clients)

    async def start(self, startup_timeout: float) -> stages_pb2.TalkerInfo:
        """Check the replicas' health from now on, wait until the talker answers GetModelInfo
        and fetch its tokenizer; a talker-named model learns its name here."""
        for client in self.stage_clients:
            client.start_health_checks(*self._health)
        info = await self.info.wait_until_available(startup_timeout)
        if self._name is None:
            self._name = info.model.model_name
        await self.tokens.load()
        model = info.model
        logger.info(
            "talker model: %s (%s), %d speakers, %d languages, instruct %s, speech tokenizer %s; speaker stage %s",
            self.name,
            model_label(model),
            len(model.speakers),
            len(model.languages),
            model.instruct_supported,
            info.speech_tokenizer[:12] or "(not reported)",
            "configured" if self.speaker else "not configured (no voice cloning)",
        )
        return info

    async def talker_info(self) -> stages_pb2.TalkerInfo:
        """The talker's info (cached; refreshed when stale)."""
        return await self.info.get()

    def public_info(self, talker: stages_pb2.TalkerInfo, *, is_default: bool = False) -> tts_pb2.ModelInfo:
        """The model as clients see it: its served name, voice cloning only with a speaker
        stage, its voice family."""
        info = effective_model_info(talker)
        info.model_name = self.name
        info.voice_clone_supported = info.voice_clone_supported and self.speaker is not None
        info.voice_family = voice_family(talker)
        info.is_default = is_default
        return info

    async def close(self) -> None:
        """Stop the tokenizer fetch and close its stage channels."""
        await self.tokens.close()
        for client in self.stage_clients:
            await client.close()


__all__ = ["ModelBackend", "voice_family"]
