"""The gateway's core, independent of the transport: what a Synthesize, a voice registration or a
model-info request does, for the gRPC servicer (:mod:`gateway.server`) and any other front end.

``synthesize``: admission (at most ``max_concurrent_streams`` streams, else RESOURCE_EXHAUSTED at
once) -> the shared validator against the talker's model info -> voice resolution (registered
voice, or the speaker stage for an inline clone) -> ``Talker.Generate`` piped into
``Decoder.Decode`` (:mod:`gateway.pipeline`) -> PCM encoded as requested
(:mod:`gateway.audio_stream`). It yields ``SynthesizeResponse`` messages: one metadata, audio
chunks, one summary. Closing the iterator (client gone, deadline) cancels both stage calls; a stage
failing mid-stream raises a StageError naming the stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from tts_common import metrics
from tts_common.errors import CapacityError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.health import ServingHealth
from tts_common.serving.names import service_name
from tts_common.serving.request_ids import REQUEST_ID_METADATA_KEY
from tts_common.serving.server import channel_options, keepalive_channel_options
from tts_common.synthesis.validation import (
    NATIVE_SAMPLE_RATE,
    RequestLimits,
    effective_model_info,
    plan_sampling_options,
    talker_request,
)

from .audio_stream import AudioStream
from .cloning import VoiceResolver
from .config import STAGE, GatewayConfig
from .encoding import AudioOutput
from .failover import FailoverPolicy
from .model_info import REFRESH_TIMEOUT_S, TalkerInfoCache
from .pipeline import StageError, SynthesisPipeline
from .routing import StageClient, tie_readiness
from .validation import validate_register, validate_synthesize
from .voices import StoredVoice, VoiceStore, new_voice_id

logger = logging.getLogger(__name__)

_RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A restarted stage is used again within seconds (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)

TalkerClient = StageClient[stages_pb2_grpc.TalkerStub]
DecoderClient = StageClient[stages_pb2_grpc.DecoderStub]
SpeakerClient = StageClient[stages_pb2_grpc.SpeakerStub]


class SynthesisService:
    """The public API's behaviour (see the module doc). Build it inside the running event loop."""

    def __init__(
        self,
        config: GatewayConfig,
        talker: TalkerClient,
        decoder: DecoderClient,
        speaker: SpeakerClient | None,
        voices: VoiceStore | None = None,
    ) -> None:
        self.config = config
        self.talker = talker
        self.decoder = decoder
        self.speaker = speaker
        self.voices = voices or VoiceStore(config.voices_dir, config.max_voices)
        self.limits = RequestLimits(
            max_text_chars=config.max_text_chars,
            max_ref_audio_seconds=config.max_ref_audio_seconds,
            max_ref_audio_bytes=config.max_ref_audio_bytes,
        )
        self.model_info = TalkerInfoCache(
            talker,
            ttl_seconds=config.model_info_ttl_seconds,
            refresh_timeout_seconds=min(REFRESH_TIMEOUT_S, config.stage_timeout_seconds),
        )
        self.failover = FailoverPolicy.from_config(config)
        self.voice_resolver = VoiceResolver(
            speaker, self.voices, self.limits, config.stage_timeout_seconds, failover=self.failover
        )
        self.active_streams = 0

    @classmethod
    def from_config(
        cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None
    ) -> SynthesisService:
        """Create the stage clients (channels) from ``config``; call inside the event loop.
        ``options``: base channel options (default :func:`tts_common.serving.channel_options`)."""
        opts = [
            *(channel_options() if options is None else options),
            *_RECONNECT_OPTIONS,
            *keepalive_channel_options(config.keepalive_seconds, config.keepalive_timeout_seconds),
            *config.channel_options,
        ]
        talker = StageClient(
            "talker",
            config.talker_targets,
            stages_pb2_grpc.TalkerStub,
            options=opts,
            health_service=service_name(stages_pb2, "Talker"),
        )
        decoder = StageClient(
            "decoder",
            config.decoder_targets,
            stages_pb2_grpc.DecoderStub,
            options=opts,
            health_service=service_name(stages_pb2, "Decoder"),
        )
        speaker = None
        if config.speaker_targets:
            speaker = StageClient(
                "speaker",
                config.speaker_targets,
                stages_pb2_grpc.SpeakerStub,
                options=opts,
                health_service=service_name(stages_pb2, "Speaker"),
            )
        return cls(config, talker, decoder, speaker)

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load registered voices and wait until the talker answers GetModelInfo (the server
        reports NOT_SERVING meanwhile); start checking the stage replicas' health."""
        for client in self.stage_clients:
            client.start_health_checks(
                self.config.health_check_interval_seconds, self.config.health_check_timeout_seconds
            )
        await asyncio.to_thread(self.voices.load)
        info = await self.model_info.wait_until_available(self.config.startup_timeout_seconds)
        model = info.model
        logger.info(
            "talker model: %s (%s %s), %d speakers, %d languages, instruct %s; speaker stage %s",
            model.model_name,
            model.model_type,
            model.model_size,
            len(model.speakers),
            len(model.languages),
            model.instruct_supported,
            "configured" if self.speaker else "not configured (no voice cloning)",
        )

    @property
    def stage_clients(self) -> tuple[StageClient[Any], ...]:
        """The clients of every configured stage."""
        return tuple(c for c in (self.talker, self.decoder, self.speaker) if c is not None)

    def tie_readiness(self, health: ServingHealth) -> None:
        """Make ``health`` report NOT_SERVING for the public services while no talker or no
        decoder replica passes its health checks (SERVING again once one does). The speaker is
        left out: without it only voice cloning fails."""
        tie_readiness(health, (self.talker, self.decoder))

    async def close(self) -> None:
        """Stop the health checks and close every stage channel."""
        for client in self.stage_clients:
            await client.close()

    # --- model info and voices -----------------------------------------------------------------
    async def public_model_info(self) -> tts_pb2.ModelInfo:
        """The served model as clients see it (voice cloning only with a speaker stage)."""
        info = effective_model_info(await self.model_info.get())
        info.voice_clone_supported = info.voice_clone_supported and self.speaker is not None
        return info

    async def list_voices(self) -> tts_pb2.ListVoicesResponse:
        info = await self.public_model_info()
        return tts_pb2.ListVoicesResponse(
            model_type=info.model_type,
            model_size=info.model_size,
            speakers=info.speakers,
            languages=info.languages,
            instruct_supported=info.instruct_supported,
            voice_clone_supported=info.voice_clone_supported,
            voices=[v.voice for v in self.voices.list_voices()],
            sample_rate=info.sample_rate,
        )

    async def register_voice(
        self, request: tts_pb2.RegisterVoiceRequest, request_id: str, time_remaining: float | None
    ) -> tts_pb2.Voice:
        """Embed the reference once and store the voice (RESOURCE_EXHAUSTED past the limit)."""
        talker = await self.model_info.get()
        validate_register(request, talker.model, self.limits)
        self.voices.check_capacity()
        reference = request.reference
        embedding = await self.voice_resolver.embed(
            reference, request_id, time_remaining, talker, "reference"
        )
        created = Timestamp()
        created.GetCurrentTime()
        stored = StoredVoice(
            voice=tts_pb2.Voice(
                voice_id=new_voice_id(),
                name=request.name,
                x_vector_only=reference.x_vector_only,
                ref_text="" if reference.x_vector_only else reference.ref_text,
                ref_audio_seconds=embedding.audio_seconds,
                created_at=created,
            ),
            speaker_embedding=list(embedding.speaker_embedding),
            ref_codes=None if reference.x_vector_only else embedding.ref_codes,
            model_name=talker.model.model_name,
            audio_sha256=embedding.audio_sha256,
        )
        await self.voices.add(stored)
        logger.info(
            "registered voice %s (%r, %s, %.1f s reference)",
            stored.voice_id,
            request.name,
            "x-vector only" if reference.x_vector_only else "in-context",
            stored.voice.ref_audio_seconds,
        )
        return stored.voice

    async def delete_voice(self, voice_id: str) -> None:
        if not voice_id.strip():
            raise InvalidRequestError("voice_id is empty")
        await self.voices.delete(voice_id.strip())
        logger.info("deleted voice %s", voice_id)

    # --- synthesis ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """One stream's place (RESOURCE_EXHAUSTED at once when the server is at capacity)."""
        limit = self.config.max_concurrent_streams
        if self.active_streams >= limit:
            raise CapacityError(f"server at capacity ({limit} concurrent Synthesize streams); retry later")
        self.active_streams += 1
        metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)
        try:
            yield
        finally:
            self.active_streams -= 1
            metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)

    async def synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        *,
        received: float,
        time_remaining: float | None = None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        """The response stream of one Synthesize request (see the module doc). ``speed``: the
        output's time-scale factor (OpenAI's ``speed``; 1.0 leaves the audio untouched)."""
        with self.admission():
            try:
                async for response in self._synthesize(request, request_id, received, time_remaining, speed):
                    yield response
            finally:
                metrics.REQUEST_DURATION.labels(stage=STAGE).observe(time.monotonic() - received)

    async def _synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        received: float,
        time_remaining: float | None,
        speed: float = 1.0,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        talker_info = await self.model_info.get()
        info = effective_model_info(talker_info)
        plan, out = validate_synthesize(
            request,
            info,
            self.limits,
            self.config.default_first_chunk_frames,
            self.config.default_max_chunk_frames,
        )
        output = AudioOutput(
            out.encoding, out.sample_rate, info.sample_rate or NATIVE_SAMPLE_RATE, speed=speed
        )
        voice = await self.voice_resolver.resolve(plan, request_id, time_remaining, talker_info)
        message = talker_request(
            plan,
            request_id,
            speaker_embedding=voice.speaker_embedding,
            ref_codes=voice.ref_codes,
            ref_text=voice.ref_text,
        )
        decode_start = stages_pb2.DecodeStart(
            request_id=request_id,
            first_chunk_frames=out.first_chunk_frames,
            max_chunk_frames=out.max_chunk_frames,
        )
        if voice.ref_codes is not None and voice.ref_codes.num_frames > 0:
            decode_start.prefix_codes.CopyFrom(voice.ref_codes)  # left context; its audio is not sent
        pipeline = SynthesisPipeline(
            self.talker,
            self.decoder,
            message,
            decode_start,
            timeout=time_remaining,
            metadata=((REQUEST_ID_METADATA_KEY, request_id),),
            drain_timeout=self.config.stage_timeout_seconds,
            failover=self.failover,
        )
        try:
            await pipeline.start()
            yield tts_pb2.SynthesizeResponse(
                metadata=tts_pb2.SynthesisMetadata(
                    request_id=request_id,
                    sample_rate=out.sample_rate,
                    encoding=out.encoding,
                    model_type=info.model_type,
                    model_size=info.model_size,
                    model_name=info.model_name,
                    language=plan.language,
                    text_feeding=plan.text_feeding,
                    sampling=plan_sampling_options(plan),
                )
            )
            stream = AudioStream(out, output, received)
            async with contextlib.aclosing(pipeline.pcm_chunks()) as pcm_chunks:
                async for pcm in pcm_chunks:
                    yield await stream.chunk(np.frombuffer(pcm.samples, dtype="<f4"))
            final = await stream.finish()
            if final is not None:
                yield final
            done = pipeline.talker_done
            assert done is not None  # DecodeDone only follows TalkerDone
            if done.finish_reason not in (tts_pb2.FINISH_REASON_EOS, tts_pb2.FINISH_REASON_LENGTH):
                raise StageError(
                    "talker",
                    grpc.StatusCode.UNAVAILABLE,
                    f"generation ended early (finish_reason {tts_pb2.FinishReason.Name(done.finish_reason)})",
                )
            yield tts_pb2.SynthesizeResponse(summary=stream.summary(done))
        except StageError as exc:
            if exc.stage == "talker" and exc.code is grpc.StatusCode.UNAVAILABLE:
                self.model_info.invalidate()
            raise
        finally:
            await pipeline.close()
