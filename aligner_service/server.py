"""The aligner gRPC servicer: an utterance's audio and text in, its units' times out.

A request flows: check the audio (float32 PCM at any supported rate, not longer than the model
takes) and cut the text into units (:mod:`aligner_service.text`), both off the event loop; then
the units' words and the audio join the next batch (:mod:`.batcher`), whose forward pass on the
compute thread gives each unit's start and end class; those are repaired (the official
``fix_timestamp``) and sent back in milliseconds with each unit's span of the text.

The model is injected (``load_model`` and ``make_input``, wired by ``__main__`` to
:mod:`aligner_service.model`), so this module depends only on the model's interface:
``predict_classes(inputs) -> [[class] * 2 * len(words)]`` plus ``sample_rate``,
``timestamp_resolution_ms``, ``max_audio_seconds``, ``device``, ``dtype`` and ``model_name``. Any
resampling and level normalisation are the model's (its inputs carry their own rate).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc
import numpy as np
import torch

from tts_common import metrics
from tts_common.audio import AudioError, check_finite, check_sample_rate, decode_raw_samples
from tts_common.compute_thread import ComputeThread
from tts_common.errors import InvalidRequestError, UnavailableError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import handle_rpc_errors

from .batcher import Batcher
from .config import STAGE, AlignerConfig
from .text import Unit, UnitMode, repaired_unit_times, split_units

logger = logging.getLogger(__name__)

UNIT_MODES: dict[int, UnitMode] = {
    stages_pb2.ALIGN_UNIT_UNSPECIFIED: "word",
    stages_pb2.ALIGN_UNIT_WORD: "word",
    stages_pb2.ALIGN_UNIT_CHARACTER: "character",
}
"""``AlignRequest.unit`` -> unit mode (unspecified means words)."""


class Aligner(Protocol):
    """What the servicer needs of a loaded aligner (``aligner_service.model.ForcedAligner``)."""

    sample_rate: int
    timestamp_resolution_ms: float
    max_audio_seconds: float
    model_name: str
    device: Any
    dtype: Any

    def predict_classes(self, batch: Sequence[Any]) -> list[list[int]]:
        """Per input, ``2 * len(words)`` raw timestamp classes (start, end per word); a
        ``ValueError`` for an input the model cannot use."""
        ...


MakeInput = Callable[..., Any]
"""Builds one model input: ``make_input(audio=float32 [n], sample_rate=int, words=[str])``."""


def decode_pcm(pcm: bytes, sample_rate: int, max_seconds: float) -> np.ndarray:
    """``AlignRequest.pcm`` as float32 mono samples; :class:`InvalidRequestError` for empty,
    undecodable, non-finite or too long audio, or an unsupported rate."""
    if not pcm:
        raise InvalidRequestError("audio is empty (0 bytes of pcm)")
    try:
        rate = check_sample_rate(sample_rate)
        samples = decode_raw_samples(pcm, "float32")[:, 0]
        check_finite(samples)
    except AudioError as exc:
        raise InvalidRequestError(f"audio: {exc}") from exc
    seconds = samples.shape[0] / rate
    if seconds > max_seconds:
        raise InvalidRequestError(
            f"audio too long: {seconds:.2f} s (the aligner takes at most {max_seconds:g} s)"
        )
    return samples


def timed_units(
    units: Sequence[Unit], classes: Sequence[int], resolution_ms: float
) -> list[stages_pb2.AlignedUnit]:
    """Each unit with its repaired (start, end) (:func:`~aligner_service.text.repaired_unit_times`
    of the model's raw ``classes``)."""
    times = repaired_unit_times(classes, resolution_ms, len(units))
    return [
        stages_pb2.AlignedUnit(
            text=unit.text,
            char_start=unit.char_start,
            char_end=unit.char_end,
            start_ms=float(start),
            end_ms=float(end),
        )
        for unit, (start, end) in zip(units, times)
    ]


class AlignerServicer(stages_pb2_grpc.AlignerServicer):
    """Owns the aligner model, its compute thread and the batcher."""

    def __init__(
        self,
        model_dir: str,
        config: AlignerConfig,
        *,
        load_model: Callable[..., Aligner],
        make_input: MakeInput,
    ) -> None:
        self.model_dir = model_dir
        self.config = config
        self._load_model = load_model
        self._make_input = make_input
        self.model: Aligner | None = None
        self.batcher: Batcher[Any, list[int]] | None = None
        self.max_audio_seconds = 0.0
        self.total_requests = 0
        # All of this process's torch work runs on this one thread (tts_common.compute_thread).
        self.compute = ComputeThread("aligner-compute")

    async def load(self) -> None:
        """Load the checkpoint on the compute thread and start batching."""
        model = await self.compute.run(
            self._load_model,
            self.model_dir,
            device=self.config.device,
            dtype=getattr(torch, self.config.dtype),
        )
        limit = self.config.max_audio_seconds or math.inf
        self.max_audio_seconds = min(limit, float(model.max_audio_seconds))
        self.batcher = Batcher(
            model.predict_classes,
            self.compute,
            max_batch=self.config.max_batch_size,
            wait_s=self.config.batch_wait_ms / 1000.0,
            max_waiting=self.config.max_waiting,
        )
        self.batcher.start()
        self.model = model
        logger.info(
            "aligner %s on %s/%s: batches of up to %d, audio up to %g s",
            model.model_name,
            self.config.device,
            self.config.dtype,
            self.config.max_batch_size,
            self.max_audio_seconds,
        )

    async def close(self) -> None:
        """Stop batching (after the server drained) and the compute thread."""
        if self.batcher is not None:
            await self.batcher.stop()
        await asyncio.to_thread(self.compute.shutdown)

    def _ready(self) -> tuple[Aligner, Batcher[Any, list[int]]]:
        if self.model is None or self.batcher is None:
            raise UnavailableError("the aligner model is still loading")
        return self.model, self.batcher

    def _prepare(self, request: stages_pb2.AlignRequest, mode: UnitMode) -> tuple[np.ndarray, list[Unit]]:
        samples = decode_pcm(request.pcm, request.sample_rate, self.max_audio_seconds)
        return samples, split_units(request.text, request.language, mode)

    @handle_rpc_errors(stage=STAGE)
    async def Align(
        self, request: stages_pb2.AlignRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.AlignResponse:
        with request_context(resolve_request_id(request.request_id, context)):
            model, batcher = self._ready()
            started = time.perf_counter()
            mode = UNIT_MODES.get(request.unit)
            if mode is None:
                raise InvalidRequestError(f"unknown AlignUnit {request.unit}")
            try:
                samples, units = await asyncio.to_thread(self._prepare, request, mode)
                metrics.AUDIO_SECONDS.labels(stage=STAGE).inc(samples.shape[0] / request.sample_rate)
                if not units:  # nothing to time (no letter or digit): no forward pass
                    return stages_pb2.AlignResponse()
                item = self._make_input(
                    audio=samples, sample_rate=request.sample_rate, words=[u.text for u in units]
                )
                try:
                    result = await batcher.submit(item)
                except ValueError as exc:  # the model refuses this input (e.g. too short to hear)
                    if isinstance(exc, InvalidRequestError):
                        raise
                    raise InvalidRequestError(f"audio: {exc}") from exc
                reply = stages_pb2.AlignResponse(
                    units=timed_units(units, result.value, model.timestamp_resolution_ms),
                    align_ms=result.forward_ms,
                )
                metrics.REQUEST_DURATION.labels(stage=STAGE).observe(time.perf_counter() - started)
                return reply
            finally:
                self.total_requests += 1

    @handle_rpc_errors(stage=STAGE)
    async def GetStats(
        self, request: stages_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.StageStats:
        batcher = self.batcher
        return stages_pb2.StageStats(
            stage=STAGE,
            running_requests=batcher.running if batcher else 0,
            waiting_requests=batcher.waiting if batcher else 0,
            max_batch_size=self.config.max_batch_size,
            total_requests=self.total_requests,
            ready=self.model is not None,
            device=self.config.device,
            dtype=self.config.dtype,
        )

    @handle_rpc_errors(stage=STAGE)
    async def GetModelInfo(
        self, request: stages_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.AlignerInfo:
        model, _ = self._ready()
        return stages_pb2.AlignerInfo(
            model_name=model.model_name,
            sample_rate=int(model.sample_rate),
            max_audio_seconds=self.max_audio_seconds,
            timestamp_resolution_ms=float(model.timestamp_resolution_ms),
            device=str(model.device),
            dtype=str(model.dtype).removeprefix("torch."),
        )


__all__ = ["UNIT_MODES", "Aligner", "AlignerServicer", "decode_pcm", "timed_units"]
