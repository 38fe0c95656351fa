"""Voices for the talker: a registered voice from the store, or an inline clone embedded by the
speaker stage (x-vector, and reference codes for in-context cloning)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from tts_common.errors import FailedPreconditionError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.request_ids import REQUEST_ID_METADATA_KEY
from tts_common.synthesis.validation import (
    NATIVE_SAMPLE_RATE,
    RequestLimits,
    SynthesisPlan,
    check_speaker_embedding,
    decode_reference,
)

from .config import FailoverPolicy
from .failover import call_with_failover
from .pipeline import StageError
from .routing import Endpoint, StageClient
from .voices import VoiceStore


@dataclass(frozen=True)
class ResolvedVoice:
    """What the talker request carries for a voice (empty for preset speakers / voice design)."""

    speaker_embedding: tuple[float, ...] = ()
    ref_codes: stages_pb2.Codes | None = None
    """In-context cloning: the reference codes (also the decoder's left context)."""
    ref_text: str = ""


def stage_timeout(limit: float, time_remaining: float | None) -> float:
    """A stage call's deadline: ``limit``, or the client's remaining time if shorter."""
    return limit if time_remaining is None else max(min(limit, time_remaining), 0.001)


class VoiceResolver:
    """Resolves the voice of a plan (see the module doc)."""

    def __init__(
        self,
        speaker: StageClient[stages_pb2_grpc.SpeakerStub] | None,
        voices: VoiceStore,
        limits: RequestLimits,
        timeout_seconds: float,
        *,
        failover: FailoverPolicy | None = None,
    ) -> None:
        """``failover``: how a speaker call that fails at the connection level is retried on
        another replica (default :class:`FailoverPolicy`)."""
        self.speaker = speaker
        self.voices = voices
        self.limits = limits
        self.timeout_seconds = timeout_seconds
        self.failover = failover or FailoverPolicy()

    def require_speaker(self) -> StageClient[stages_pb2_grpc.SpeakerStub]:
        """The speaker stage; FAILED_PRECONDITION if this gateway has none."""
        if self.speaker is None:
            raise FailedPreconditionError(
                "voice cloning from reference audio needs the speaker stage, and this gateway "
                "has none configured (--speaker-targets / QWEN3TTS_SPEAKER_TARGETS); "
                "registered voices (voice_id) still work"
            )
        return self.speaker

    async def embed(
        self,
        clone: tts_pb2.VoiceClone,
        request_id: str,
        time_remaining: float | None,
        talker: stages_pb2.TalkerInfo,
        field: str = "clone",
    ) -> stages_pb2.ReferenceEmbedding:
        """The x-vector (+ reference codes unless x-vector-only) of reference audio, decoded here
        first so bad audio gets INVALID_ARGUMENT naming ``field``."""
        speaker = self.require_speaker()
        samples = await asyncio.to_thread(decode_reference, clone, self.limits, field)
        want_codes = not clone.x_vector_only
        request = stages_pb2.ReferenceAudio(
            request_id=request_id,
            audio=clone.ref_audio,
            encoding=clone.ref_audio_encoding,
            sample_rate=clone.ref_audio_sample_rate,
            want_codes=want_codes,
        )

        async def call(endpoint: Endpoint[stages_pb2_grpc.SpeakerStub]) -> stages_pb2.ReferenceEmbedding:
            reply: stages_pb2.ReferenceEmbedding = await endpoint.stub.EmbedReference(
                request,
                timeout=stage_timeout(self.timeout_seconds, time_remaining),
                metadata=((REQUEST_ID_METADATA_KEY, request_id),),
            )
            return reply

        try:
            # Stateless: a replica lost mid-call is simply asked again elsewhere.
            embedding = await call_with_failover(speaker, self.failover, request_id, call)
        except grpc.aio.AioRpcError as exc:
            raise StageError.from_rpc_error("speaker", exc) from exc
        check_speaker_embedding(
            len(embedding.speaker_embedding), talker.speaker_embedding_dim, "the speaker stage's x-vector"
        )
        if want_codes and embedding.ref_codes.num_frames <= 0:
            raise StageError(
                "speaker", grpc.StatusCode.INTERNAL, "EmbedReference returned no reference codes"
            )
        if not embedding.audio_seconds:
            embedding.audio_seconds = samples.shape[0] / NATIVE_SAMPLE_RATE
        return embedding

    async def resolve(
        self,
        plan: SynthesisPlan,
        request_id: str,
        time_remaining: float | None,
        talker: stages_pb2.TalkerInfo,
    ) -> ResolvedVoice:
        """The voice of ``plan`` for the talker request."""
        if plan.voice_kind == "voice_id":
            stored = self.voices.get(plan.voice_id)
            check_speaker_embedding(
                len(stored.speaker_embedding),
                talker.speaker_embedding_dim,
                f"registered voice {plan.voice_id}",
            )
            if stored.voice.x_vector_only:
                return ResolvedVoice(tuple(stored.speaker_embedding))
            return ResolvedVoice(tuple(stored.speaker_embedding), stored.ref_codes, stored.voice.ref_text)
        if plan.voice_kind == "clone":
            assert plan.clone is not None
            embedding = await self.embed(plan.clone, request_id, time_remaining, talker)
            if plan.clone.x_vector_only:
                return ResolvedVoice(tuple(embedding.speaker_embedding))
            return ResolvedVoice(tuple(embedding.speaker_embedding), embedding.ref_codes, plan.clone.ref_text)
        return ResolvedVoice()
