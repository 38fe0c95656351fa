"""The speaker stage of a Base model: reference audio to x-vector (and reference codes for
in-context cloning), called once per inline clone or voice registration, retried on another
replica when one is lost (the stage is stateless)."""

from __future__ import annotations

import asyncio

import grpc

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import (
    NATIVE_SAMPLE_RATE,
    RequestLimits,
    check_speaker_embedding,
    decode_reference,
)

from ..config import FailoverPolicy
from .errors import StageError
from .failover import call_stateless_stage, stage_timeout
from .routing import StageClient


class SpeakerStage:
    """One model's speaker stage replicas (see the module doc)."""

    def __init__(
        self,
        client: StageClient[stages_pb2_grpc.SpeakerStub],
        limits: RequestLimits,
        timeout_seconds: float,
        *,
        failover: FailoverPolicy | None = None,
    ) -> None:
        """``failover``: how a call that fails at the connection level is retried on another
        replica (default :class:`FailoverPolicy`)."""
        self.client = client
        self.limits = limits
        self.timeout_seconds = timeout_seconds
        self.failover = failover or FailoverPolicy()

    async def embed(
        self,
        clone: tts_pb2.VoiceClone,
        request_id: str,
        time_remaining: float | None,
        talker: stages_pb2.TalkerInfo,
        field: str = "clone",
    ) -> stages_pb2.ReferenceEmbedding:
        """The x-vector (+ reference codes unless x-vector-only) of reference audio, decoded here
        first so bad audio gets INVALID_ARGUMENT naming ``field``; the x-vector is checked
        against ``talker``'s size."""
        samples = await asyncio.to_thread(decode_reference, clone, self.limits, field)
        want_codes = not clone.x_vector_only
        request = stages_pb2.ReferenceAudio(
            request_id=request_id,
            audio=clone.ref_audio,
            encoding=clone.ref_audio_encoding,
            sample_rate=clone.ref_audio_sample_rate,
            want_codes=want_codes,
        )
        embedding: stages_pb2.ReferenceEmbedding = await call_stateless_stage(
            self.client,
            self.failover,
            lambda stub: stub.EmbedReference,
            request,
            request_id,
            stage_timeout(self.timeout_seconds, time_remaining),
        )
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


__all__ = ["SpeakerStage"]
