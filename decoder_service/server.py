"""The decoder gRPC servicer: codec frames in, 24 kHz audio out, batched across streams.

Protocol (``qwen3tts.internal.v1.Decoder/Decode``, bidirectional): ``DecodeStart`` (optional
voice-clone prefix codes, chunk schedule), then ``CodecChunk``s as the talker produces them, then
``DecodeEnd``. The server answers ``PcmChunk``s (float32 LE) following the request's chunk
schedule (small first chunk, growing to ``max_chunk_frames``; earlier where a listener would
run out of audio first, :mod:`.pacing`) and a final ``DecodeDone``. The
audio is the exact whole-utterance decode, chunk boundaries included (streaming state, no
re-decoding of left context).

Batching: every stream hands its ready chunk to :class:`DecodeBatcher`, which advances all the
sessions waiting at that moment with one forward of the decoder.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from tts_common import metrics
from tts_common.chunking import CHUNK_GROWTH, resolve_chunking
from tts_common.codes import codes_from_proto
from tts_common.compute_thread import ComputeThread
from tts_common.config import load_checkpoint_config
from tts_common.errors import CapacityError, FailedPreconditionError, InvalidRequestError, UnavailableError
from tts_common.fingerprint import reported_fingerprint
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.self_check import step_path
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import handle_rpc_errors

from .config import DecoderConfig
from .model.decoder import CodecDecoder
from .model.loading import load_codec_decoder
from .model.self_check import start_batcher
from .model.streaming import ChunkSchedule, DecoderSession, SessionBatcher
from .pacing import PlayoutPacer

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    session: DecoderSession
    codes: np.ndarray
    future: asyncio.Future


class DecodeBatcher:
    """Collects ready chunks of many streams and advances them together (one forward each round)."""

    def __init__(self, batcher: SessionBatcher, compute: ComputeThread) -> None:
        self.batcher = batcher
        self.compute = compute
        self._pending: list[_Job] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.last_batch_size = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def decode(self, session: DecoderSession, codes: np.ndarray) -> np.ndarray:
        """Audio of ``codes`` ([n, Q]) continuing ``session``; waits for the next batched round."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(session, codes, future))
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            jobs, self._pending = self._pending, []
            # A session appears at most once per round (its stream awaits each chunk).
            jobs = [j for j in jobs if not j.future.done()]
            if not jobs:
                continue
            self.last_batch_size = len(jobs)
            metrics.BATCH_SIZE.labels(stage="decoder").observe(len(jobs))
            t0 = time.monotonic()
            try:
                outs = await self.compute.run(
                    self._advance, [j.session for j in jobs], [j.codes for j in jobs]
                )
            except Exception as exc:  # noqa: BLE001 - delivered to every waiting stream
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            metrics.STEP_DURATION.labels(stage="decoder").observe(time.monotonic() - t0)
            for job, out in zip(jobs, outs):
                if not job.future.done():
                    job.future.set_result(out)

    def _advance(self, sessions: list[DecoderSession], codes: list[np.ndarray]) -> list[np.ndarray]:
        """One batched round (compute thread): each session's new samples as float32 numpy."""
        return [out.float().cpu().numpy() for out in self.batcher.advance(sessions, codes)]


class DecoderServicer(stages_pb2_grpc.DecoderServicer):
    """Owns the speech-tokenizer decoder and the cross-stream batcher."""

    def __init__(self, model_dir: str, config: DecoderConfig) -> None:
        self.model_dir = model_dir
        self.config = config
        self.decoder: CodecDecoder | None = None
        self.batcher: DecodeBatcher | None = None
        self.running = 0
        self.total_requests = 0
        self.sample_rate = 24000
        self.speech_tokenizer = ""
        """Fingerprint of the loaded speech tokenizer (tts_common.fingerprint)."""
        self.step_path = "eager"
        self.fallback_reason = ""
        """Why the decoder runs eager although graphs were wanted (DecoderInfo)."""
        # All of this process's torch work runs on this one thread (tts_common.compute_thread).
        self.compute = ComputeThread("decoder-compute")

    async def load(self) -> None:
        t0 = time.monotonic()
        cfg = load_checkpoint_config(self.model_dir)
        self.sample_rate = cfg.speech_tokenizer.output_sample_rate
        self.speech_tokenizer = await asyncio.to_thread(reported_fingerprint, self.model_dir)
        t1 = time.monotonic()
        self.decoder = await self.compute.run(
            load_codec_decoder,
            self.model_dir,
            self.config.device,
            getattr(torch, self.config.dtype),
        )
        # Built on the compute thread: on CUDA it captures every bucket now and self-checks them,
        # before SERVING (--cuda-graphs: a failure falls back to eager, or stops the stage).
        t2 = time.monotonic()
        batcher, outcome = await self.compute.run(
            start_batcher,
            self.decoder,
            self.config.cuda_graphs,
            self.config.emulate_cuda_graphs,
            graph_memory=self.config.graph_memory or None,
        )
        self.fallback_reason = outcome.fallback_reason
        t3 = time.monotonic()
        graphs = batcher.graphs
        self.step_path = step_path(None if graphs is None else graphs.report.mode, outcome.fallback_reason)
        self.batcher = DecodeBatcher(batcher, self.compute)
        self.batcher.start()
        if batcher.graphs is not None:
            logger.info(
                "decoder graphs: %s, plus %.0f MiB of static inputs (state shared per batch size); %s",
                batcher.graphs.report.summary(),
                batcher.graphs.static_bytes / 2**20,
                batcher.graphs.describe_bound(),
            )
        logger.info(
            "decoder startup: fingerprint %.1f s, weights %.1f s, graphs + self-check %.1f s (%s)",
            t1 - t0,
            t2 - t1,
            t3 - t2,
            self.step_path,
        )

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
        await asyncio.to_thread(self.compute.shutdown)

    @handle_rpc_errors(stage="decoder")
    async def Decode(
        self,
        request_iterator: AsyncIterator[stages_pb2.DecoderClientMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stages_pb2.DecoderServerMessage]:
        if self.decoder is None or self.batcher is None:
            raise UnavailableError("decoder model is still loading")
        messages = aiter(request_iterator)
        first = await anext(messages, None)
        if first is None or first.WhichOneof("message") != "start":
            raise FailedPreconditionError("the first Decode message must be a DecodeStart")
        start = first.start
        with request_context(resolve_request_id(start.request_id, context)):
            if self.running >= self.config.max_streams:
                raise CapacityError(f"decoder is at its stream limit ({self.config.max_streams})")
            schedule = self._schedule(start)
            self.running += 1
            self.total_requests += 1
            metrics.RUNNING_REQUESTS.labels(stage="decoder").set(self.running)
            try:
                async for reply in self._stream(start, schedule, messages):
                    yield reply
            finally:
                self.running -= 1
                metrics.RUNNING_REQUESTS.labels(stage="decoder").set(self.running)

    def _schedule(self, start: stages_pb2.DecodeStart) -> ChunkSchedule:
        first, largest = resolve_chunking(start.first_chunk_frames, start.max_chunk_frames, field_prefix="")
        return ChunkSchedule(first=first, growth=CHUNK_GROWTH, max=largest)

    def _check_codes(self, codes: np.ndarray, what: str) -> np.ndarray:
        assert self.decoder is not None
        q = self.decoder.num_quantizers
        if codes.ndim != 2 or codes.shape[1] != q:
            raise InvalidRequestError(f"{what}: expected [frames, {q}] codes, got {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.decoder.config.codebook_size):
            raise InvalidRequestError(f"{what}: codes must be in [0, {self.decoder.config.codebook_size})")
        return codes

    async def _stream(
        self,
        start: stages_pb2.DecodeStart,
        schedule: ChunkSchedule,
        messages: AsyncIterator[stages_pb2.DecoderClientMessage],
    ) -> AsyncIterator[stages_pb2.DecoderServerMessage]:
        assert self.decoder is not None and self.batcher is not None
        prefix = None
        if start.HasField("prefix_codes") and start.prefix_codes.num_frames:
            prefix = self._check_codes(codes_from_proto(start.prefix_codes), "prefix_codes")
            if prefix.shape[0] > self.config.max_prefix_frames:
                raise InvalidRequestError(
                    f"prefix of {prefix.shape[0]} frames exceeds {self.config.max_prefix_frames}"
                )
        session = await self.compute.run(DecoderSession, self.decoder, prefix)
        spf = self.decoder.samples_per_frame
        pacer = PlayoutPacer(schedule, spf / self.sample_rate, self.config.playout_headroom_ms / 1000)
        pending: list[np.ndarray] = []
        pending_frames = 0
        emitted_frames = 0
        t0 = time.monotonic()
        first_chunk_ms = 0.0
        expected_frame = 0
        ended = False

        async def emit(n: int) -> stages_pb2.DecoderServerMessage:
            nonlocal pending, pending_frames, emitted_frames, first_chunk_ms
            block = np.concatenate(pending, axis=0)
            codes, rest = block[:n], block[n:]
            pending, pending_frames = ([rest] if len(rest) else []), len(rest)
            started = time.monotonic()
            audio = await self.batcher.decode(session, codes)
            msg = stages_pb2.DecoderServerMessage(
                pcm=stages_pb2.PcmChunk(
                    samples=audio.astype("<f4").tobytes(),
                    sample_rate=self.sample_rate,
                    start_sample=emitted_frames * spf,
                    num_samples=len(audio),
                    start_frame=emitted_frames,
                    num_frames=n,
                )
            )
            now = time.monotonic()
            if pacer.chunks == 0:
                first_chunk_ms = (now - t0) * 1000
            pacer.sent(n, now, now - started)
            emitted_frames += n
            return msg

        # The next message is awaited as a task that outlives a timeout: the pacer may need the
        # frames held sent before the talker's next one comes (cancelling a read of the request
        # stream would end it).
        next_message: asyncio.Future[stages_pb2.DecoderClientMessage | None] | None = None
        try:
            while True:
                if next_message is None:
                    next_message = asyncio.ensure_future(anext(messages, None))
                done, _ = await asyncio.wait(
                    {next_message}, timeout=pacer.wait_s(pending_frames, time.monotonic())
                )
                if not done:  # the listener's audio runs low and no frame came: send those held
                    if n := pacer.cut(pending_frames, time.monotonic()):
                        yield await emit(n)
                    continue
                message, next_message = next_message.result(), None
                if message is None:
                    break
                kind = message.WhichOneof("message")
                if kind == "chunk":
                    if ended:
                        raise FailedPreconditionError("CodecChunk after DecodeEnd")
                    codes = self._check_codes(codes_from_proto(message.chunk.codes), "chunk")
                    if message.chunk.start_frame != expected_frame:
                        raise FailedPreconditionError(
                            f"chunk starts at frame {message.chunk.start_frame}, expected {expected_frame}"
                        )
                    expected_frame += len(codes)
                    pending.append(codes)
                    pending_frames += len(codes)
                    pacer.arrived(len(codes), time.monotonic())
                    while n := pacer.cut(pending_frames, time.monotonic()):
                        yield await emit(n)
                elif kind == "end":
                    ended = True
                    break
                else:
                    raise FailedPreconditionError(f"unexpected {kind} message inside a Decode stream")
        finally:
            if next_message is not None and not next_message.done():
                next_message.cancel()
        if not ended:
            return  # the client went away without DecodeEnd: nothing more to send
        if pending_frames:
            yield await emit(pending_frames)
        yield stages_pb2.DecoderServerMessage(
            done=stages_pb2.DecodeDone(
                frames=emitted_frames,
                num_samples=emitted_frames * spf,
                decode_ms=(time.monotonic() - t0) * 1000,
                first_chunk_ms=first_chunk_ms,
            )
        )

    @handle_rpc_errors(stage="decoder")
    async def GetStats(
        self, request: stages_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.StageStats:
        return stages_pb2.StageStats(
            stage="decoder",
            running_requests=self.running,
            waiting_requests=0,
            max_batch_size=self.config.max_streams,
            total_requests=self.total_requests,
            ready=self.decoder is not None,
            device=self.config.device,
            dtype=self.config.dtype,
        )

    @handle_rpc_errors(stage="decoder")
    async def GetModelInfo(
        self, request: stages_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.DecoderInfo:
        if self.decoder is None:
            raise UnavailableError("decoder model is still loading")
        return stages_pb2.DecoderInfo(
            speech_tokenizer=self.speech_tokenizer,
            sample_rate=self.sample_rate,
            device=self.config.device,
            dtype=self.config.dtype,
            step_path=self.step_path,
            fallback_reason=self.fallback_reason,
        )
