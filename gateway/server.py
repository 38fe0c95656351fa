"""The gateway servicer: ``qwen3tts.v1.TextToSpeech`` on top of the talker, decoder and speaker.

``Synthesize``: admission (at most ``max_concurrent_streams`` streams, else RESOURCE_EXHAUSTED
at once) -> validation against the talker's model info (INVALID_ARGUMENT / NOT_FOUND with precise
messages) -> voice resolution (registered voice, or ``Speaker.EmbedReference`` for an inline
clone) -> ``Talker.Generate`` piped into ``Decoder.Decode`` (:mod:`gateway.pipeline`) -> PCM
encoded as requested (:mod:`gateway.encoding`). The client sees SynthesisMetadata, AudioChunks,
SynthesisSummary. Cancelling the call (or its deadline passing) cancels both stage calls; a stage
failing mid-stream ends the call with UNAVAILABLE naming the stage.

The talker's model info (type, speakers, languages, defaults) is fetched at startup (the
process reports NOT_SERVING until the talker answers), cached, and refreshed when older than
``model_info_ttl_seconds`` or after the talker failed (a restarted talker may serve another model).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from tts_common import metrics
from tts_common.errors import CapacityError, FailedPreconditionError, InvalidRequestError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
from tts_common.serving import (
    REQUEST_ID_METADATA_KEY,
    ServerConfig,
    build_server,
    channel_options,
    handle_rpc_errors,
    resolve_request_id,
    service_name,
)

from .auth import ApiKeyInterceptor
from .config import STAGE, GatewayConfig
from .encoding import NATIVE_SAMPLE_RATE, AudioOutput
from .pipeline import StageError, SynthesisPipeline
from .routing import StageClient
from .validation import (
    RequestLimits,
    SynthesisPlan,
    decode_reference,
    effective_model_info,
    validate_register,
    validate_synthesize,
)
from .voices import StoredVoice, VoiceStore, new_voice_id

logger = logging.getLogger(__name__)

SERVICE_NAME = service_name(tts_pb2, "TextToSpeech")

_RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A restarted stage is used again within seconds (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)
_INFO_REFRESH_TIMEOUT_S = 3.0
_STARTUP_PROBE_TIMEOUT_S = 5.0

TalkerClient = StageClient[stages_pb2_grpc.TalkerStub]
DecoderClient = StageClient[stages_pb2_grpc.DecoderStub]
SpeakerClient = StageClient[stages_pb2_grpc.SpeakerStub]


def _now_timestamp() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts


class GatewayServicer(tts_pb2_grpc.TextToSpeechServicer):
    """The public API (see the module doc). Build it inside the running event loop."""

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
            default_first_chunk_frames=config.default_first_chunk_frames,
            default_max_chunk_frames=config.default_max_chunk_frames,
        )
        self.active_streams = 0
        self._info: stages_pb2.TalkerInfo | None = None
        self._info_at = 0.0
        self._info_stale = True
        self._info_lock = asyncio.Lock()

    @classmethod
    def from_config(
        cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None
    ) -> GatewayServicer:
        """Create the stage clients (channels) from ``config``; call inside the event loop.
        ``options``: base channel options (default :func:`tts_common.serving.channel_options`)."""
        opts = [
            *(channel_options() if options is None else options),
            *_RECONNECT_OPTIONS,
            *config.channel_options,
        ]
        talker = StageClient("talker", config.talker_targets, stages_pb2_grpc.TalkerStub, options=opts)
        decoder = StageClient("decoder", config.decoder_targets, stages_pb2_grpc.DecoderStub, options=opts)
        speaker = (
            StageClient("speaker", config.speaker_targets, stages_pb2_grpc.SpeakerStub, options=opts)
            if config.speaker_targets
            else None
        )
        return cls(config, talker, decoder, speaker)

    # -----------------------------------------------------------------------------------------
    # Lifecycle

    async def start(self) -> None:
        """Load registered voices and wait until the talker answers GetModelInfo (the server
        reports NOT_SERVING meanwhile)."""
        await asyncio.to_thread(self.voices.load)
        started = time.monotonic()
        delay = 0.25
        while True:
            try:
                info = await self._fetch_info(_STARTUP_PROBE_TIMEOUT_S, wait_for_ready=True)
                break
            except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
                waited = time.monotonic() - started
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "timeout"
                limit = self.config.startup_timeout_seconds
                if limit and waited >= limit:
                    raise RuntimeError(
                        f"talker {', '.join(self.talker.targets)} not reachable after "
                        f"{waited:.0f} s: {detail}"
                    ) from exc
                logger.warning(
                    "waiting for the talker at %s (%.0f s): %s",
                    ", ".join(self.talker.targets),
                    waited,
                    detail,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
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

    async def close(self) -> None:
        """Close every stage channel."""
        for client in (self.talker, self.decoder, self.speaker):
            if client is not None:
                await client.close()

    # -----------------------------------------------------------------------------------------
    # Model info

    async def _fetch_info(self, timeout: float, *, wait_for_ready: bool = False) -> stages_pb2.TalkerInfo:
        with self.talker.lease() as endpoint:
            info: stages_pb2.TalkerInfo = await endpoint.stub.GetModelInfo(
                stages_pb2.GetModelInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
            )
        self._info, self._info_at, self._info_stale = info, time.monotonic(), False
        return info

    def invalidate_model_info(self) -> None:
        """Re-fetch the model info before the next request (e.g. after a talker failure)."""
        self._info_stale = True

    def _cached_info(self) -> stages_pb2.TalkerInfo | None:
        """The cached talker info if it is still fresh, else None."""
        fresh = not self._info_stale and time.monotonic() - self._info_at < self.config.model_info_ttl_seconds
        return self._info if fresh else None

    async def talker_info(self) -> stages_pb2.TalkerInfo:
        """The cached talker info, refreshed when stale; if the refresh fails the cached copy
        is used (UNAVAILABLE if there is none)."""
        if (info := self._cached_info()) is not None:
            return info
        async with self._info_lock:
            if (info := self._cached_info()) is not None:
                return info  # refreshed by a concurrent request
            try:
                return await self._fetch_info(min(_INFO_REFRESH_TIMEOUT_S, self.config.stage_timeout_seconds))
            except grpc.aio.AioRpcError as exc:
                if self._info is None:
                    raise StageError.from_rpc_error("talker", exc) from exc
                logger.warning("model info refresh failed (using the cached copy): %s", exc.details())
                self._info_at = time.monotonic()  # retry after the TTL, not on every request
                return self._info

    def _public_model_info(self, talker: stages_pb2.TalkerInfo) -> tts_pb2.ModelInfo:
        info = effective_model_info(talker)
        info.voice_clone_supported = info.voice_clone_supported and self.speaker is not None
        return info

    # -----------------------------------------------------------------------------------------
    # Voices

    def _require_speaker(self) -> SpeakerClient:
        if self.speaker is None:
            raise FailedPreconditionError(
                "voice cloning from reference audio needs the speaker stage, and this gateway "
                "has none configured (--speaker-targets / QWEN3TTS_SPEAKER_TARGETS); "
                "registered voices (voice_id) still work"
            )
        return self.speaker

    async def _embed(
        self,
        clone: tts_pb2.VoiceClone,
        request_id: str,
        context: grpc.aio.ServicerContext,
        talker: stages_pb2.TalkerInfo,
    ) -> stages_pb2.ReferenceEmbedding:
        """x-vector (+ reference codes unless x-vector-only) from the speaker stage."""
        speaker = self._require_speaker()
        timeout = self.config.stage_timeout_seconds
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = max(min(timeout, remaining), 0.001)
        want_codes = not clone.x_vector_only
        request = stages_pb2.ReferenceAudio(
            request_id=request_id,
            audio=clone.ref_audio,
            encoding=clone.ref_audio_encoding,
            sample_rate=clone.ref_audio_sample_rate,
            want_codes=want_codes,
        )
        with speaker.lease() as endpoint:
            try:
                embedding: stages_pb2.ReferenceEmbedding = await endpoint.stub.EmbedReference(
                    request, timeout=timeout, metadata=((REQUEST_ID_METADATA_KEY, request_id),)
                )
            except grpc.aio.AioRpcError as exc:
                raise StageError.from_rpc_error("speaker", exc) from exc
        self._check_embedding_dim(len(embedding.speaker_embedding), talker, "speaker stage")
        if want_codes and embedding.ref_codes.num_frames <= 0:
            raise StageError(
                "speaker", grpc.StatusCode.INTERNAL, "EmbedReference returned no reference codes"
            )
        return embedding

    @staticmethod
    def _check_embedding_dim(dim: int, talker: stages_pb2.TalkerInfo, source: str) -> None:
        want = talker.speaker_embedding_dim
        if want > 0 and dim != want:
            raise FailedPreconditionError(
                f"the {source} gives a speaker embedding of {dim} values but the talker's model "
                f"({talker.model.model_name}) needs {want}: different models?"
            )

    async def _resolve_voice(
        self,
        plan: SynthesisPlan,
        request_id: str,
        context: grpc.aio.ServicerContext,
        talker: stages_pb2.TalkerInfo,
    ) -> tuple[Sequence[float], stages_pb2.Codes | None, str]:
        """(speaker_embedding, ref_codes, ref_text) for the talker request."""
        if plan.voice_kind == "voice_id":
            stored = self.voices.get(plan.voice_id)
            self._check_embedding_dim(
                len(stored.speaker_embedding), talker, f"registered voice {plan.voice_id}"
            )
            if stored.voice.x_vector_only:
                return stored.speaker_embedding, None, ""
            return stored.speaker_embedding, stored.ref_codes, stored.voice.ref_text
        if plan.voice_kind == "clone":
            assert plan.clone is not None
            self._require_speaker()
            await asyncio.to_thread(decode_reference, plan.clone, self.limits)
            embedding = await self._embed(plan.clone, request_id, context, talker)
            if plan.clone.x_vector_only:
                return embedding.speaker_embedding, None, ""
            return embedding.speaker_embedding, embedding.ref_codes, plan.clone.ref_text
        return (), None, ""

    # -----------------------------------------------------------------------------------------
    # Synthesize

    @handle_rpc_errors(stage=STAGE)
    async def Synthesize(
        self, request: tts_pb2.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        received = time.monotonic()
        request_id = resolve_request_id(request.request_id, context)
        with request_context(request_id):
            limit = self.config.max_concurrent_streams
            if self.active_streams >= limit:
                raise CapacityError(
                    f"server at capacity ({limit} concurrent Synthesize streams); retry later"
                )
            self.active_streams += 1
            metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)
            try:
                async for response in self._synthesize(request, context, request_id, received):
                    yield response
            finally:
                self.active_streams -= 1
                metrics.RUNNING_REQUESTS.labels(stage=STAGE).set(self.active_streams)
                metrics.REQUEST_DURATION.labels(stage=STAGE).observe(time.monotonic() - received)

    async def _synthesize(
        self,
        request: tts_pb2.SynthesizeRequest,
        context: grpc.aio.ServicerContext,
        request_id: str,
        received: float,
    ) -> AsyncIterator[tts_pb2.SynthesizeResponse]:
        talker_info = await self.talker_info()
        info = effective_model_info(talker_info)
        plan = validate_synthesize(request, info, self.limits)
        native_rate = info.sample_rate or NATIVE_SAMPLE_RATE
        output = AudioOutput(plan.encoding, plan.sample_rate, native_rate)
        embedding, ref_codes, ref_text = await self._resolve_voice(plan, request_id, context, talker_info)
        talker_request = stages_pb2.TalkerRequest(
            request_id=request_id,
            text=plan.text,
            language=plan.language,
            speaker=plan.speaker,
            instruct=plan.instruct,
            speaker_embedding=embedding,
            ref_text=ref_text,
            text_feeding=plan.text_feeding,
            sampling=plan.sampling,
            frames_per_chunk=1,
        )
        decode_start = stages_pb2.DecodeStart(
            request_id=request_id,
            first_chunk_frames=plan.first_chunk_frames,
            max_chunk_frames=plan.max_chunk_frames,
        )
        if ref_codes is not None and ref_codes.num_frames > 0:
            talker_request.ref_codes.CopyFrom(ref_codes)
            decode_start.prefix_codes.CopyFrom(ref_codes)  # left context; its audio is not sent

        with self.talker.lease() as talker, self.decoder.lease() as decoder:
            pipeline = SynthesisPipeline(
                talker.stub,
                decoder.stub,
                talker_request,
                decode_start,
                timeout=context.time_remaining(),
                metadata=((REQUEST_ID_METADATA_KEY, request_id),),
                drain_timeout=self.config.stage_timeout_seconds,
            )
            try:
                await pipeline.start()
                yield tts_pb2.SynthesizeResponse(
                    metadata=tts_pb2.SynthesisMetadata(
                        request_id=request_id,
                        sample_rate=plan.sample_rate,
                        encoding=plan.encoding,
                        model_type=info.model_type,
                        model_size=info.model_size,
                        model_name=info.model_name,
                        language=plan.language,
                        text_feeding=plan.text_feeding,
                        sampling=plan.sampling,
                    )
                )
                stream = _ChunkStream(plan, output, received)
                async with contextlib.aclosing(pipeline.pcm_chunks()) as pcm_chunks:
                    async for pcm in pcm_chunks:
                        samples = np.frombuffer(pcm.samples, dtype="<f4")
                        yield await stream.chunk(samples)
                final = await stream.finish()
                if final is not None:
                    yield final
                done = pipeline.talker_done
                assert done is not None  # DecodeDone only follows TalkerDone
                if done.finish_reason not in (tts_pb2.FINISH_REASON_EOS, tts_pb2.FINISH_REASON_LENGTH):
                    raise StageError(
                        "talker",
                        grpc.StatusCode.UNAVAILABLE,
                        "generation ended early (finish_reason "
                        f"{tts_pb2.FinishReason.Name(done.finish_reason)})",
                    )
                yield tts_pb2.SynthesizeResponse(summary=stream.summary(done))
            except StageError as exc:
                if exc.stage == "talker" and exc.code is grpc.StatusCode.UNAVAILABLE:
                    self.invalidate_model_info()
                raise
            finally:
                await pipeline.close()

    # -----------------------------------------------------------------------------------------
    # Voices and model info RPCs

    @handle_rpc_errors(stage=STAGE)
    async def ListVoices(
        self, request: tts_pb2.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ListVoicesResponse:
        with request_context(resolve_request_id("", context)):
            info = self._public_model_info(await self.talker_info())
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

    @handle_rpc_errors(stage=STAGE)
    async def GetModelInfo(
        self, request: tts_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.ModelInfo:
        with request_context(resolve_request_id("", context)):
            return self._public_model_info(await self.talker_info())

    @handle_rpc_errors(stage=STAGE)
    async def RegisterVoice(
        self, request: tts_pb2.RegisterVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.Voice:
        request_id = resolve_request_id("", context)
        with request_context(request_id):
            talker = await self.talker_info()
            validate_register(request, talker.model, self.limits)
            self.voices.check_capacity()
            self._require_speaker()
            reference = request.reference
            seconds = await asyncio.to_thread(decode_reference, reference, self.limits, "reference")
            embedding = await self._embed(reference, request_id, context, talker)
            stored = StoredVoice(
                voice=tts_pb2.Voice(
                    voice_id=new_voice_id(),
                    name=request.name,
                    x_vector_only=reference.x_vector_only,
                    ref_text="" if reference.x_vector_only else reference.ref_text,
                    ref_audio_seconds=embedding.audio_seconds or seconds,
                    created_at=_now_timestamp(),
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

    @handle_rpc_errors(stage=STAGE)
    async def DeleteVoice(
        self, request: tts_pb2.DeleteVoiceRequest, context: grpc.aio.ServicerContext
    ) -> tts_pb2.DeleteVoiceResponse:
        with request_context(resolve_request_id("", context)):
            if not request.voice_id.strip():
                raise InvalidRequestError("voice_id is empty")
            await self.voices.delete(request.voice_id.strip())
            logger.info("deleted voice %s", request.voice_id)
            return tts_pb2.DeleteVoiceResponse()


class _ChunkStream:
    """Turns PCM chunks into AudioChunk responses and keeps the per-request statistics."""

    def __init__(self, plan: SynthesisPlan, output: AudioOutput, received: float) -> None:
        self.plan = plan
        self.output = output
        self.received = received
        self.index = 0
        self.num_samples = 0
        self.first_audio_at: float | None = None
        self.last_chunk_at: float | None = None

    async def _run(self, fn: Callable[..., tuple[bytes, int]], *args: Any) -> tuple[bytes, int]:
        # Codecs, resampling and time-scaling take real CPU time: keep the event loop free.
        if self.output.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _response(self, data: bytes, n: int) -> tts_pb2.SynthesizeResponse:
        now = time.monotonic()
        if self.first_audio_at is None:
            self.first_audio_at = now
            metrics.TIME_TO_FIRST_AUDIO.labels(stage=STAGE).observe(now - self.received)
        elif self.last_chunk_at is not None:
            metrics.INTER_CHUNK_LATENCY.labels(stage=STAGE).observe(now - self.last_chunk_at)
        self.last_chunk_at = now
        chunk = tts_pb2.AudioChunk(
            data=data,
            sample_rate=self.plan.sample_rate,
            encoding=self.plan.encoding,
            index=self.index,
            start_sample=self.num_samples,
            num_samples=n,
        )
        self.index += 1
        self.num_samples += n
        if n:
            metrics.AUDIO_SECONDS.labels(stage=STAGE).inc(n / self.plan.sample_rate)
        return tts_pb2.SynthesizeResponse(audio=chunk)

    async def chunk(self, samples: np.ndarray) -> tts_pb2.SynthesizeResponse:
        data, n = await self._run(self.output.process, samples)
        return self._response(data, n)

    async def finish(self) -> tts_pb2.SynthesizeResponse | None:
        """The last chunk (resampler tail, encoder trailer), if there is anything left."""
        data, n = await self._run(self.output.finish)
        if not data and not n:
            return None
        return self._response(data, n)

    def summary(self, done: stages_pb2.TalkerDone) -> tts_pb2.SynthesisSummary:
        total = time.monotonic() - self.received
        audio_seconds = self.num_samples / self.plan.sample_rate
        rtf = total / audio_seconds if audio_seconds > 0 else 0.0
        if audio_seconds > 0:
            metrics.REAL_TIME_FACTOR.labels(stage=STAGE).observe(rtf)
        ttfa = (self.first_audio_at - self.received) * 1000 if self.first_audio_at is not None else 0.0
        logger.info(
            "done: %d frames, %.2f s audio in %d chunks, first audio %.0f ms, total %.0f ms, rtf %.3f, %s",
            done.frames,
            audio_seconds,
            self.index,
            ttfa,
            total * 1000,
            rtf,
            tts_pb2.FinishReason.Name(done.finish_reason),
        )
        return tts_pb2.SynthesisSummary(
            frames=done.frames,
            num_samples=self.num_samples,
            audio_seconds=audio_seconds,
            time_to_first_audio_ms=ttfa,
            total_ms=total * 1000,
            rtf=rtf,
            finish_reason=done.finish_reason,
            num_chunks=self.index,
            queue_ms=done.queue_ms,
        )


# ---------------------------------------------------------------------------------------------
# Server assembly


def server_credentials(config: GatewayConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the public port, or None for plaintext."""
    if not config.tls_cert or not config.tls_key:
        return None
    with open(config.tls_cert, "rb") as fh:
        cert = fh.read()
    with open(config.tls_key, "rb") as fh:
        key = fh.read()
    client_ca = None
    if config.tls_client_ca:
        with open(config.tls_client_ca, "rb") as fh:
            client_ca = fh.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_setup(
    servicer: GatewayServicer, config: GatewayConfig
) -> tuple[Callable[[grpc.aio.Server], None], dict[str, Any]]:
    """``add_servicers`` and the extra ``build_server`` keyword arguments (API-key
    interceptor, TLS) for :func:`tts_common.serving.serve` / ``build_server``."""
    kwargs: dict[str, Any] = {}
    if config.api_keys:
        kwargs["interceptors"] = [ApiKeyInterceptor(config.api_keys, stage=STAGE)]
    credentials = server_credentials(config)
    if credentials is not None:
        kwargs["credentials"] = credentials

    def add_servicers(server: grpc.aio.Server) -> None:
        tts_pb2_grpc.add_TextToSpeechServicer_to_server(servicer, server)

    return add_servicers, kwargs


def build_gateway_server(
    server_config: ServerConfig, servicer: GatewayServicer, config: GatewayConfig, **build_kwargs: Any
) -> tuple[grpc.aio.Server, Any]:
    """:func:`tts_common.serving.build_server` for the gateway (tests and embedding)."""
    add_servicers, kwargs = server_setup(servicer, config)
    return build_server(server_config, add_servicers, [SERVICE_NAME], **kwargs, **build_kwargs)


__all__ = ["GatewayServicer", "SERVICE_NAME", "build_gateway_server", "server_credentials", "server_setup"]
