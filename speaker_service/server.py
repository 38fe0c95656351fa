"""The speaker gRPC servicer: reference audio -> speaker embedding (+ ICL reference codes), cached.

Results are cached by the SHA-256 of the audio bytes and how to read them (encoding, sample
rate) in a bounded LRU, so registering or re-using the same reference is free.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from tts_common import metrics
from tts_common.audio import AudioError, AudioLimits, load_audio
from tts_common.codes import codes_to_proto
from tts_common.compute_thread import ComputeThread
from tts_common.config import load_checkpoint_config
from tts_common.errors import CapacityError, InvalidRequestError, UnavailableError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import handle_rpc_errors
from tts_common.synthesis.validation import REFERENCE_ENCODINGS

from .config import SpeakerConfig
from .model.frontend import VoiceCloneFrontEnd

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    embedding: np.ndarray
    codes: np.ndarray | None
    seconds: float


class SpeakerServicer(stages_pb2_grpc.SpeakerServicer):
    """Owns the voice-clone front end (speaker encoder + speech-tokenizer encoder)."""

    def __init__(self, model_dir: str, config: SpeakerConfig) -> None:
        self.model_dir = model_dir
        self.config = config
        self.frontend: VoiceCloneFrontEnd | None = None
        self.unsupported_reason: str | None = None
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._slots = asyncio.Semaphore(config.max_concurrent)
        self._waiting = 0
        self.total_requests = 0
        self.running = 0
        # All of this process's torch work runs on this one thread (tts_common.compute_thread).
        self.compute = ComputeThread("speaker-compute")

    async def close(self) -> None:
        await asyncio.to_thread(self.compute.shutdown)

    async def load(self) -> None:

        cfg = load_checkpoint_config(self.model_dir)
        if cfg.model.tts_model_type != "base":
            # Not an error: the stage is optional and answers FAILED_PRECONDITION-like errors.
            self.unsupported_reason = (
                f"voice cloning needs a Base checkpoint; {self.model_dir} is {cfg.model.tts_model_type!r}"
            )
            logger.warning("%s", self.unsupported_reason)
            return
        self.frontend = await self.compute.run(
            VoiceCloneFrontEnd.from_checkpoint,
            self.model_dir,
            self.config.device,
            getattr(torch, self.config.dtype),
        )

    def _key(self, msg: stages_pb2.ReferenceAudio) -> str:
        h = hashlib.sha256(msg.audio)
        h.update(f"|{REFERENCE_ENCODINGS.get(msg.encoding, '?')}|{msg.sample_rate}".encode())
        return h.hexdigest()

    def _compute(self, msg: stages_pb2.ReferenceAudio, want_codes: bool) -> _Entry:
        assert self.frontend is not None
        encoding = REFERENCE_ENCODINGS.get(msg.encoding)
        if encoding is None:
            raise InvalidRequestError(f"unknown reference audio encoding {msg.encoding}")
        try:
            audio = load_audio(
                msg.audio,
                msg.sample_rate or None,
                encoding=encoding,  # type: ignore[arg-type]
                target_sample_rate=self.frontend.sample_rate,
                limits=AudioLimits(max_seconds=self.config.max_audio_seconds),
            )
        except AudioError as exc:
            raise InvalidRequestError(f"reference audio: {exc}") from exc
        with torch.inference_mode():
            embedding = self.frontend.embed(audio).numpy()
            codes = self.frontend.encode_reference(audio).numpy() if want_codes else None
        return _Entry(embedding, codes, len(audio) / self.frontend.sample_rate)

    @handle_rpc_errors(stage="speaker")
    async def EmbedReference(
        self, request: stages_pb2.ReferenceAudio, context: grpc.aio.ServicerContext
    ) -> stages_pb2.ReferenceEmbedding:
        with request_context(resolve_request_id(request.request_id, context)):
            if self.frontend is None:
                raise UnavailableError(self.unsupported_reason or "speaker model is still loading")
            if not request.audio:
                raise InvalidRequestError("reference audio is empty (0 bytes)")
            self.total_requests += 1
            key = self._key(request)
            with self._lock:
                entry = self._cache.get(key)
                if entry is not None and (entry.codes is not None or not request.want_codes):
                    self._cache.move_to_end(key)
                    metrics.CACHE_LOOKUPS.labels(stage="speaker", result="hit").inc()
                    return self._reply(entry, request.want_codes, key, cache_hit=True)
            metrics.CACHE_LOOKUPS.labels(stage="speaker", result="miss").inc()
            if self._waiting >= self.config.max_waiting:
                raise CapacityError(f"speaker stage is busy ({self._waiting} references waiting)")
            self._waiting += 1
            acquired = False
            try:
                await self._slots.acquire()
                acquired = True
            finally:
                self._waiting -= 1
            try:
                self.running += 1
                entry = await self.compute.run(self._compute, request, request.want_codes)
            finally:
                self.running -= 1
                if acquired:
                    self._slots.release()
            with self._lock:
                self._cache[key] = entry
                self._cache.move_to_end(key)
                while len(self._cache) > self.config.cache_size:
                    self._cache.popitem(last=False)
            return self._reply(entry, request.want_codes, key, cache_hit=False)

    @staticmethod
    def _reply(entry: _Entry, want_codes: bool, key: str, cache_hit: bool) -> stages_pb2.ReferenceEmbedding:
        reply = stages_pb2.ReferenceEmbedding(
            speaker_embedding=entry.embedding.astype(np.float32).tolist(),
            audio_seconds=entry.seconds,
            cache_hit=cache_hit,
            audio_sha256=key,
        )
        if want_codes and entry.codes is not None:
            reply.ref_codes.CopyFrom(codes_to_proto(entry.codes))
        return reply

    @handle_rpc_errors(stage="speaker")
    async def GetStats(
        self, request: stages_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.StageStats:
        return stages_pb2.StageStats(
            stage="speaker",
            running_requests=self.running,
            waiting_requests=self._waiting,
            max_batch_size=self.config.max_concurrent,
            total_requests=self.total_requests,
            ready=self.frontend is not None,
            device=self.config.device,
            dtype=self.config.dtype,
        )
