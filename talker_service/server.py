"""The talker gRPC servicer: ``Generate`` streams codec frames from the continuous-batching engine.

Protocol (``qwen3tts.internal.v1.Talker/Generate``, bidirectional): the client's first message is
a ``TalkerRequest``; it may later send ``Cancel`` (or simply cancel the call), and with
``text_open`` the rest of the text as ``AppendText`` messages closed by ``EndText``
(``engine.text_feed``). The server answers with ``CodecChunk`` messages as frames are produced
(``frames_per_chunk`` frames each, default 1) and one final ``TalkerDone``. Invalid requests fail
with INVALID_ARGUMENT before any chunk; a full queue with RESOURCE_EXHAUSTED; client messages out
of order (text messages without ``text_open`` or after ``EndText``, a second request, a half-close
before ``EndText``) with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import torch

from tts_common import metrics
from tts_common.codes import codes_to_proto
from tts_common.compute_thread import run_in_fresh_thread
from tts_common.errors import FailedPreconditionError, InvalidRequestError, UnavailableError
from tts_common.logging_setup import request_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.self_check import step_path
from tts_common.serving.request_ids import resolve_request_id
from tts_common.serving.rpc_errors import handle_rpc_errors

from .engine import EngineConfig, FinishReason, FrameEvent, RequestStream, TalkerEngine
from .engine.text_feed import TextFeed
from .model.loader import TalkerModel
from .model_info import engine_inputs, talker_info

logger = logging.getLogger(__name__)

FINISH_REASONS = {
    FinishReason.EOS: tts_pb2.FINISH_REASON_EOS,
    FinishReason.LENGTH: tts_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: tts_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: tts_pb2.FINISH_REASON_ERROR,
}
MAX_FRAMES_PER_CHUNK = 64


class TalkerServicer(stages_pb2_grpc.TalkerServicer):
    """Owns the loaded model and the engine; one ``Generate`` stream per utterance."""

    def __init__(self, model_dir: str, engine_config: EngineConfig) -> None:
        self.model_dir = model_dir
        self.engine_config = engine_config
        self.model: TalkerModel | None = None
        self.engine: TalkerEngine | None = None
        self.info: stages_pb2.TalkerInfo | None = None
        self.tokenizer_files: stages_pb2.TokenizerFiles | None = None
        self.total_requests = 0

    async def load(self) -> None:
        """Load the checkpoint and start the engine (health turns SERVING afterwards)."""
        config = self.engine_config

        phases: dict[str, float] = {}

        def load_model_and_engine() -> tuple[TalkerModel, TalkerEngine]:
            t0 = time.monotonic()
            model = TalkerModel.from_checkpoint(self.model_dir, config.device, getattr(torch, config.dtype))
            phases["weights"] = time.monotonic() - t0
            engine = TalkerEngine(model, config)  # plans and allocates the KV cache, captures graphs
            phases.update(engine.startup_seconds)
            return model, engine

        # Loading computes (casts, oneDNN weight packing, cache fill): in a thread that exits, so
        # the engine's loop is the process's only compute thread (tts_common.compute_thread).
        self.model, self.engine = await run_in_fresh_thread(load_model_and_engine)
        self.engine_config = self.engine.config  # the slots the memory budget holds
        self.tokenizer_files = stages_pb2.TokenizerFiles(files=self.model.tokenizer_files)
        check = self.engine.graph_check
        graphs = self.engine.runner.graphs
        path = step_path(None if graphs is None else graphs.report.mode, check.fallback_reason)
        self.info = talker_info(self.model, self.engine_config, path, check.fallback_reason)
        self.engine.on_step.append(self._observe_step)
        self.engine.start()
        logger.info(
            "talker ready: %s (%s %s), %d slots x %d positions, %.1f MiB KV per slot",
            self.model_dir,
            self.model.config.model.tts_model_type,
            self.model.config.model.tts_model_size,
            self.engine_config.max_slots,
            self.engine_config.max_seq_len,
            self.engine.runner.kv_bytes_per_slot / 2**20,
        )
        graphs = self.engine.runner.graphs
        if graphs is not None:  # the capture itself logged the buckets; count it with the KV
            logger.info("talker decode graphs: %s", graphs.report.summary())
        logger.info("talker startup: %s", ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))

    def _observe_step(self, batch: int, seconds: float) -> None:
        """Engine-thread callback after each decode step (Prometheus)."""
        assert self.engine is not None
        stats = self.engine.stats()
        metrics.BATCH_SIZE.labels(stage="talker").observe(batch)
        metrics.STEP_DURATION.labels(stage="talker").observe(seconds)
        metrics.RUNNING_REQUESTS.labels(stage="talker").set(stats.running)
        metrics.WAITING_REQUESTS.labels(stage="talker").set(stats.waiting)
        metrics.GENERATED_FRAMES.labels(stage="talker").inc(batch)

    async def close(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)

    def _require(self) -> tuple[TalkerModel, TalkerEngine, stages_pb2.TalkerInfo]:
        if self.model is None or self.engine is None or self.info is None:
            raise UnavailableError("talker model is still loading")
        return self.model, self.engine, self.info

    @handle_rpc_errors(stage="talker")
    async def Generate(
        self,
        request_iterator: AsyncIterator[stages_pb2.TalkerClientMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[stages_pb2.TalkerServerMessage]:
        model, engine, info = self._require()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("message") != "request":
            raise FailedPreconditionError("the first Generate message must be a TalkerRequest")
        msg = first.request
        request_id = resolve_request_id(msg.request_id, context)
        with request_context(request_id):
            self.total_requests += 1
            chunk_frames = msg.frames_per_chunk or 1
            if not 1 <= chunk_frames <= MAX_FRAMES_PER_CHUNK:
                raise InvalidRequestError(
                    f"frames_per_chunk must be in [1, {MAX_FRAMES_PER_CHUNK}], got {chunk_frames}"
                )
            inputs, sampling, max_new_tokens = engine_inputs(msg, info, model)
            feed = TextFeed() if msg.text_open else None
            # The prompt is built on the engine thread when the engine admits the request.
            events = engine.generate(request_id, inputs, sampling, max_new_tokens, text=feed)
            reader = asyncio.create_task(self._read_client(request_iterator, events, feed))
            pending: list[list[int]] = []
            start_frame = 0
            t0 = time.monotonic()
            try:
                async for event in events:
                    if isinstance(event, FrameEvent):
                        pending.append(event.codes)
                        if len(pending) >= chunk_frames:
                            yield self._chunk(start_frame, pending)
                            start_frame += len(pending)
                            pending = []
                        continue
                    if pending:
                        yield self._chunk(start_frame, pending)
                    if event.reason is FinishReason.ERROR and event.error is not None:
                        raise event.error
                    metrics.QUEUE_TIME.labels(stage="talker").observe(event.timing.queue_ms / 1000)
                    if feed is not None:
                        metrics.TEXT_WAIT_TIME.labels(stage="talker").observe(event.timing.text_wait)
                        metrics.STALLED_FRAMES.labels(stage="talker").inc(event.timing.stalls)
                    yield stages_pb2.TalkerServerMessage(
                        done=stages_pb2.TalkerDone(
                            frames=event.frames,
                            finish_reason=FINISH_REASONS[event.reason],
                            queue_ms=event.timing.queue_ms,
                            prefill_ms=event.timing.prefill_ms,
                            first_frame_ms=event.timing.first_frame_ms,
                            total_ms=(time.monotonic() - t0) * 1000,
                            prompt_tokens=event.prompt_len,
                            text_wait_ms=event.timing.text_wait * 1000,
                            stalled_frames=event.timing.stalls,
                        )
                    )
            finally:
                reader.cancel()
                await events.aclose()  # no-op once finished; frees the slot if the call ended early

    @staticmethod
    def _chunk(start_frame: int, frames: list[list[int]]) -> stages_pb2.TalkerServerMessage:
        return stages_pb2.TalkerServerMessage(
            chunk=stages_pb2.CodecChunk(start_frame=start_frame, codes=codes_to_proto(frames))
        )

    @staticmethod
    async def _read_client(
        request_iterator: AsyncIterator[stages_pb2.TalkerClientMessage],
        events: RequestStream,
        feed: TextFeed | None,
    ) -> None:
        """The client's messages after the request: Cancel cancels the engine request, text
        messages go to ``feed``; a protocol error fails ``events`` (the call fails with it, after
        the frames already produced)."""
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("message")
                if kind == "cancel":
                    events.cancel()
                    return
                if kind == "request":
                    raise FailedPreconditionError("a second TalkerRequest on one Generate call")
                if kind in ("append_text", "end_text"):
                    name = "AppendText" if kind == "append_text" else "EndText"
                    if feed is None:
                        raise FailedPreconditionError(f"{name} needs a TalkerRequest with text_open set")
                    if kind == "append_text":
                        feed.append(message.append_text.text)
                    else:
                        feed.end()
            # Half-close: fine once the text is complete (or was never open).
            if feed is not None and not feed.ended and not events.request.finished:
                raise FailedPreconditionError(
                    "the client closed its side before EndText (the text never ended)"
                )
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            return
        except FailedPreconditionError as exc:
            events.fail(exc)

    @handle_rpc_errors(stage="talker")
    async def GetStats(
        self, request: stages_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.StageStats:
        ready = self.engine is not None
        stats = self.engine.stats() if self.engine is not None else None
        return stages_pb2.StageStats(
            stage="talker",
            running_requests=stats.running if stats else 0,
            waiting_requests=stats.waiting if stats else 0,
            max_batch_size=self.engine_config.max_slots,
            total_requests=self.total_requests,
            ready=ready,
            device=self.engine_config.device,
            dtype=self.engine_config.dtype,
        )

    @handle_rpc_errors(stage="talker")
    async def GetModelInfo(
        self, request: stages_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.TalkerInfo:
        _, _, info = self._require()
        return info

    @handle_rpc_errors(stage="talker")
    async def GetTokenizer(
        self, request: stages_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.TokenizerFiles:
        self._require()
        assert self.tokenizer_files is not None  # set with the model
        return self.tokenizer_files
