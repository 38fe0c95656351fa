"""The talker engine: a scheduler loop on its own thread that owns the model and the device.

It is the only decode loop of the project: the gRPC servicer, the offline command
(``qwen3-tts synthesize``) and the benchmarks all submit requests to it, as vLLM's offline ``LLM``
runs on the same engine as its server. Callers :meth:`~TalkerEngine.add` requests (prompt inputs,
sampling, budget, an event sink) from any thread; each enters the loop thread once. One loop
iteration reads as the scheduler's calls:

1. new requests: build the prompt, set the frame budget, ``scheduler.add`` (a request that can
   never fit, or whose prompt cannot be built, ends at once with its error);
2. ``scheduler.schedule()``: drop cancelled requests, admit waiting ones into free slots and
   prefill them, list the running ones that decode;
3. ONE decode step over those (talker + code predictor + sampling), frames delivered as events;
4. ``scheduler.update()``: retire the requests that hit EOS or their frame budget.

Incremental text (``add(..., text=TextFeed())``): before step 2, each open text is drained
through its incremental tokenizer (:mod:`.text_feed`). A request enters the scheduler once its
prompt can be built (:func:`~talker_service.model.prompt.tokens_to_start`); afterwards its new
tokens join its trailing rows and the end of its text appends ``tts_eos``. A running request
whose trailing rows are used up while its text is open is left out of the step (its slot kept).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tts_common.compute_thread import adopt_torch_threads
from tts_common.errors import CapacityError, UnavailableError
from tts_common.kernels.choice import set_up_linears
from tts_common.synthesis import SamplingParams, frame_budget

from ..model import unicode_boundaries
from ..model.loader import TalkerModel
from ..model.prompt import PromptInputs, TalkerPrompt, append_text, end_text, tokens_to_start
from .config import EngineConfig
from .kv_memory import plan_kv_cache
from .request import DoneEvent, EngineEvent, EngineRequest, EventSink, FinishReason, FrameEvent
from .runner import TalkerRunner
from .scheduler import Scheduler
from .self_check import start_graph_path
from .text_feed import TextFeed, TextStream

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """A snapshot of the engine's load."""

    running: int
    waiting: int
    max_slots: int
    steps: int
    last_batch_size: int


@dataclass
class Generation:
    """The outcome of one request run to completion (offline use)."""

    codes: np.ndarray
    """[frames, num_code_groups] int64 codec codes (the EOS frame excluded)."""
    finish_reason: FinishReason


class RequestStream:
    """One request's events for an asyncio caller (:meth:`TalkerEngine.generate`):
    ``async for event in stream`` yields its FrameEvents then one DoneEvent.

    :meth:`cancel` asks the engine to drop the request (its DoneEvent still comes); :meth:`fail`
    cancels it and makes the iteration raise an error of the caller's (a protocol error of the
    client, in arrival order with the frames); :meth:`aclose` cancels it and ends the iteration.
    """

    def __init__(self, engine: TalkerEngine, request: EngineRequest, queue: asyncio.Queue) -> None:
        self._engine = engine
        self.request = request
        self._queue: asyncio.Queue[EngineEvent | BaseException] = queue
        self._ended = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if isinstance(event, BaseException):
            self._ended = True
            raise event
        if isinstance(event, DoneEvent):
            self._ended = True
        return event

    def cancel(self) -> None:
        """Ask the engine to drop the request (no-op once finished)."""
        self._engine.cancel(self.request)

    def fail(self, error: BaseException) -> None:
        """Cancel the request; the iteration raises ``error`` after the events already queued."""
        self.cancel()
        self._queue.put_nowait(error)

    async def aclose(self) -> None:
        """Cancel the request and end the iteration (its slot is freed at the next step)."""
        self._ended = True
        self.cancel()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TalkerEngine:
    """Continuous batching over static KV slots (see the module docstring).

    The engine sets itself up for the model it runs: it sizes its KV cache from
    ``config.kv_memory`` (measured once the weights are loaded; ``config.max_slots`` becomes the
    slots that fit), chooses the linear kernels for that many slots (``config.linear``), and
    allocates the cache (and captures its graphs). :attr:`config` is the resulting
    configuration.
    """

    def __init__(self, model: TalkerModel, config: EngineConfig) -> None:
        self.model = model
        t0 = time.monotonic()
        self.config = config = _set_up(model, config)
        self.runner = TalkerRunner(model.talker, config, capture=False)
        t1 = time.monotonic()
        self.graph_check = start_graph_path(self.runner, config)
        """The graph path's startup self-check (``graph_check.fallback_reason``: why eager)."""
        self.startup_seconds = {"engine set-up": t1 - t0, "graphs + self-check": time.monotonic() - t1}
        """Seconds of each start-up phase (the server logs them)."""
        self.scheduler = Scheduler(config, on_move=self.runner.move_slot)
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[EngineRequest] = []
        self._poked = False
        """Text arrived or a request was cancelled since the loop last looked."""
        self._streams: list[EngineRequest] = []
        """Admitted requests whose text is open (engine thread only)."""
        self._unstarted = 0
        """Of those, how many wait for enough text to build their prompt."""
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.last_batch_size = 0
        self.on_step: list[Callable[[int, float], None]] = []
        """Callbacks ``f(batch_size, seconds)`` after each decode step (metrics)."""

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="talker-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop; requests still queued or running end with CANCELLED."""
        with self._lock:
            self._stopping = True
            self._wakeup.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> TalkerEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> EngineStats:
        with self._lock:
            waiting = self.scheduler.num_waiting + len(self._inbox) + self._unstarted
            running = self.scheduler.num_running
        return EngineStats(running, waiting, self.config.max_slots, self.steps, self.last_batch_size)

    # --- submission -----------------------------------------------------------------------------
    def add(
        self,
        request_id: str,
        source: PromptInputs | TalkerPrompt,
        sampling: SamplingParams,
        max_new_tokens: int | None,
        sink: EventSink,
        *,
        text: TextFeed | None = None,
    ) -> EngineRequest:
        """Queue a request whose events go to ``sink`` (thread-safe callable): FrameEvents, then
        one DoneEvent (its ``error`` set if the request was refused on admission: a prompt that
        cannot be built, or a budget that can never fit a slot).

        ``max_new_tokens`` None = the runaway guard. ``text``: the text is open: ``source`` (a
        PromptInputs) holds its start and the rest arrives through ``text`` (see the module
        docstring); the codes equal those of the whole text with streaming feeding. Raises
        CapacityError at once when the queue is full, UnavailableError when the engine is
        stopping.
        """
        if text is not None and not isinstance(source, PromptInputs):
            raise ValueError("an open text needs PromptInputs, not a ready-made prompt")
        request = EngineRequest(
            request_id=request_id,
            source=source,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            sink=sink,
            text_complete=text is None,
            text_feed=text,
        )
        with self._lock:
            if self._stopping:
                raise UnavailableError("talker engine is shutting down")
            self.scheduler.check_queue(pending=len(self._inbox) + self._unstarted)
            self._inbox.append(request)
            self._wakeup.notify_all()
        if text is not None:
            text.attach(self._poke)
        return request

    def _poke(self) -> None:
        """Wake the loop: text arrived or a request was cancelled."""
        with self._lock:
            self._poked = True
            self._wakeup.notify_all()

    def generate(
        self,
        request_id: str,
        source: PromptInputs | TalkerPrompt,
        sampling: SamplingParams,
        max_new_tokens: int | None = None,
        *,
        text: TextFeed | None = None,
    ) -> RequestStream:
        """:meth:`add` a request (``text``: an open text, as there) and return its events as a
        :class:`RequestStream`; call inside the running event loop.

        Closing the stream early (client gone, task cancelled) cancels the request; its slot is
        freed at the next step.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineEvent | BaseException] = asyncio.Queue()

        def sink(event: EngineEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        return RequestStream(
            self, self.add(request_id, source, sampling, max_new_tokens, sink, text=text), queue
        )

    def generate_all(
        self, requests: Sequence[tuple[PromptInputs | TalkerPrompt, SamplingParams, int | None]]
    ) -> list[Generation]:
        """Run ``(source, sampling, max_new_tokens)`` requests to completion from a synchronous
        caller (offline synthesis, benchmarks): all are queued (as room allows) and batched as
        slots allow. Raises the first failed request's error."""
        groups = self.model.config.model.talker.code_predictor.num_code_groups
        frames: list[list[list[int]]] = [[] for _ in requests]
        done: list[DoneEvent | None] = [None] * len(requests)
        finished = threading.Semaphore(0)

        def sink_for(i: int) -> EventSink:
            def sink(event: EngineEvent) -> None:
                if isinstance(event, FrameEvent):
                    frames[i].append(event.codes)
                else:
                    done[i] = event
                    finished.release()

            return sink

        for i, (source, sampling, max_new_tokens) in enumerate(requests):
            while True:  # more requests than the waiting queue holds: wait for room
                try:
                    self.add(f"offline-{i}", source, sampling, max_new_tokens, sink_for(i))
                    break
                except CapacityError:
                    time.sleep(0.01)
        for _ in requests:
            finished.acquire()
        out = []
        for codes, event in zip(frames, done):
            assert event is not None
            if event.error is not None:
                raise event.error
            array = np.asarray(codes, dtype=np.int64).reshape(len(codes), groups)
            out.append(Generation(codes=array, finish_reason=event.reason))
        return out

    def cancel(self, request: EngineRequest) -> None:
        """Ask the loop to drop ``request`` (no-op once finished)."""
        if not request.finished:
            request.cancelled.set()
            self._poke()

    # --- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        adopt_torch_threads()
        while True:
            with self._lock:
                while (
                    not self._stopping
                    and not self._inbox
                    and not self._poked
                    and not self.scheduler.has_work()
                ):
                    self._wakeup.wait(timeout=0.5)
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                self._poked = False
            try:
                for request in inbox:
                    self._admit(request)
                if self._streams:
                    self._pump_text()
                self._iteration()
                if self._streams:
                    self._mark_text_waits()
            except Exception as exc:  # a bug or device error: fail the requests held, keep serving
                logger.exception("talker engine step failed")
                for request in self.scheduler.requests + self._streams:
                    self.scheduler.remove(request)
                    request.finish(FinishReason.ERROR, exc)
                self._forget_finished_streams()
        with self._lock:
            leftovers = self.scheduler.requests + self._inbox + self._streams
            self._inbox = []
            self._streams = []
            self._unstarted = 0
        for request in leftovers:
            self.scheduler.remove(request)
            request.finish(FinishReason.CANCELLED)

    def _admit(self, request: EngineRequest) -> None:
        """Build the prompt and frame budget of a new request and queue it (errors end it)."""
        if request.cancelled.is_set():
            request.finish(FinishReason.CANCELLED)
            return
        try:
            source = request.source
            if request.text_feed is not None:
                assert isinstance(source, PromptInputs)
                tokenizer = self.model.tokenizer
                request.text = TextStream(
                    request.text_feed, tokenizer, source.text, tokens_to_start(tokenizer, source)
                )
                self._streams.append(request)
                self._unstarted += 1
                return  # the prompt is built once enough text has arrived (_pump_text)
            request.prompt = source if isinstance(source, TalkerPrompt) else self.model.build_prompt(source)
            self._set_budget(request)
            self.scheduler.add(request)
        except Exception as exc:  # noqa: BLE001 - delivered to the caller as the request's error
            request.finish(FinishReason.ERROR, exc)

    def _set_budget(self, request: EngineRequest) -> None:
        """The request's frame budget from its prompt (again as an open text grows: the runaway
        guard counts text tokens; while the text is open the request never gets near it, since it
        waits after each token's frame)."""
        assert request.prompt is not None
        request.max_frames = frame_budget(
            request.max_new_tokens,
            text_tokens=request.prompt.text_tokens,
            room=self.config.frames_that_fit(request.prompt_len),
            guard=self.config.runaway_guard,
        )

    # --- open texts -----------------------------------------------------------------------------
    def _pump_text(self) -> None:
        """Move newly arrived text into the requests: start those that now can, extend the
        trailing rows of running ones, end texts that ended."""
        for request in self._streams:
            if request.finished:
                continue
            text = request.text
            assert text is not None and isinstance(request.source, PromptInputs)
            if request.prompt is None and request.cancelled.is_set():
                request.finish(FinishReason.CANCELLED)
                continue
            try:
                changed = text.pull()
                if not changed:
                    continue
                if request.prompt is None:
                    if not text.can_start:
                        continue
                    request.prompt = self.model.build_prompt(
                        request.source, text.take_ids(), text_open=not text.ended, role_ids=text.role_ids
                    )
                    request.text_complete = text.ended
                    self._set_budget(request)
                    self.scheduler.add(request)
                    continue
                append_text(self.model.talker, request.prompt, text.take_ids())
                if text.ended:
                    end_text(request.prompt)
                    request.text_complete = True
                if request.max_new_tokens is None:
                    self._set_budget(request)
                if request.waiting_since is not None and not request.waiting_for_text:
                    request.timing.text_wait += time.monotonic() - request.waiting_since
                    request.waiting_since = None
            except Exception as exc:  # noqa: BLE001 - delivered to the caller as the request's error
                self.scheduler.remove(request)
                request.finish(FinishReason.ERROR, exc)
        self._forget_finished_streams()

    def _forget_finished_streams(self) -> None:
        """Drop the requests whose text ended (or that ended) from the open texts."""
        self._streams = [r for r in self._streams if not r.finished and not r.text_complete]
        unstarted = sum(1 for r in self._streams if r.prompt is None)
        with self._lock:
            self._unstarted = unstarted

    def _mark_text_waits(self) -> None:
        """Start the wait clock of running requests that just used up their text."""
        now = time.monotonic()
        for request in self._streams:
            if (
                request.slot is not None
                and not request.finished
                and request.waiting_since is None
                and request.waiting_for_text
            ):
                request.waiting_since = now
                request.timing.stalls += 1
        self._forget_finished_streams()

    def _iteration(self) -> None:
        out = self.scheduler.schedule()
        for request in out.aborted:
            request.finish(FinishReason.CANCELLED)
        if out.prefill:
            self._prefill(out.prefill)
        batch = [r for r in out.decode if not r.finished]
        if not batch:
            return
        t0 = time.monotonic()
        step = self.runner.step(batch)
        # One device->host copy per step: codes and EOS flags together.
        packed = torch.cat([step.frame_codes, step.is_eos[:, None].to(step.frame_codes.dtype)], dim=1)
        rows = packed.cpu().tolist()
        frames = [row[:-1] for row in rows]
        eos = [bool(row[-1]) for row in rows]
        now = time.monotonic()
        self.steps += 1
        self.last_batch_size = len(batch)
        for callback in self.on_step:
            callback(len(batch), now - t0)
        for request, codes in zip(batch, frames):
            if request.cancelled.is_set():
                continue  # dropped at the next schedule(), within one step
            if request.timing.first_frame is None:
                request.timing.first_frame = now
            request.sink(FrameEvent(index=request.frames_emitted, codes=codes))
        for request, reason in self.scheduler.update(batch, eos):
            request.finish(reason)

    def _prefill(self, requests: list[EngineRequest]) -> None:
        """Prefill the requests admitted this iteration together; if that fails, each alone, so
        that only the request at fault ends (with its error)."""
        start = time.monotonic()
        for request in requests:
            request.timing.prefill_start = start
        try:
            self.runner.prefill(requests)
        except Exception as exc:
            if len(requests) == 1:
                self._prefill_failed(requests[0], exc)
                return
            logger.exception("prefill of %d requests together failed; prefilling each alone", len(requests))
            for request in requests:
                try:
                    self.runner.prefill([request])
                except Exception as exc:  # noqa: BLE001 - the request ends with its error
                    self._prefill_failed(request, exc)
        end = time.monotonic()
        for request in requests:
            if not request.finished:
                request.timing.prefill_end = end

    def _prefill_failed(self, request: EngineRequest, exc: Exception) -> None:
        logger.exception("prefill failed for %s", request.request_id, exc_info=exc)
        self.scheduler.remove(request)
        request.finish(FinishReason.ERROR, exc)


def _set_up(model: TalkerModel, config: EngineConfig) -> EngineConfig:
    """The engine's set-up before it allocates anything: the KV slots ``config.kv_memory`` holds
    (at most ``config.max_slots``), the linear kernels for that many slots, and the Unicode tables
    of open texts. Returns ``config`` with ``max_slots`` set to the planned slots."""
    plan = plan_kv_cache(model.talker.cfg, config, model.dtype)
    logger.info("%s", plan.describe())
    buckets = dataclasses.replace(config, max_slots=plan.slots).graph_buckets
    kernels, _ = set_up_linears(
        model.talker, model.device, model.dtype, config.linear, config.quantization, buckets
    )
    logger.info("linear kernels: %s", kernels)
    # Built lazily otherwise, on the engine thread at the first open text (~0.5 s stall).
    unicode_boundaries.warm()
    return dataclasses.replace(config, max_slots=plan.slots)
