"""The talker engine: a scheduler loop on its own thread that owns the model and the device.

Callers (the gRPC servicer, tests, benchmarks) submit prepared prompts and read frames from an
async iterator as the loop produces them. One loop iteration: drop cancelled requests, admit
waiting ones into free slots and prefill them (bounded work), run ONE decode step over every
running request that has its input, deliver the completed frames, retire finished requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from tts_common.compute_thread import adopt_torch_threads
from tts_common.errors import UnavailableError

from ..model.prompt import TalkerPrompt
from ..model.sampling import SamplingParams
from ..model.talker import Talker
from .config import EngineConfig
from .request import DoneEvent, EngineEvent, EngineRequest, FinishReason, FrameEvent
from .runner import TalkerRunner
from .scheduler import Scheduler

logger = logging.getLogger(__name__)

T = TypeVar("T")


def num_text_tokens(prompt: TalkerPrompt) -> int:
    """Text tokens of the utterance: the synthesis ids less the chat template's 3 + 5."""
    return max(len(prompt.input_ids) - 8, 1)


@dataclass
class EngineStats:
    """A snapshot of the engine's load."""

    running: int
    waiting: int
    max_slots: int
    steps: int
    last_batch_size: int


class TalkerEngine:
    """Continuous batching over static KV slots (see the package docstring)."""

    def __init__(self, talker: Talker, config: EngineConfig) -> None:
        self.config = config
        self.runner = TalkerRunner(talker, config)
        self.scheduler = Scheduler(config)
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[EngineRequest] = []
        self._calls: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.last_batch_size = 0
        self.on_step: list = []
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

    def stats(self) -> EngineStats:
        with self._lock:
            waiting = self.scheduler.num_waiting + len(self._inbox)
            running = self.scheduler.num_running
        return EngineStats(running, waiting, self.config.max_slots, self.steps, self.last_batch_size)

    # --- submission -----------------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        prompt: TalkerPrompt,
        sampling: SamplingParams,
        max_frames: int | None,
        sink: Callable[[EngineEvent], None],
        text_complete: bool = True,
    ) -> EngineRequest:
        """Queue a request whose events go to ``sink`` (thread-safe callable).

        ``max_frames`` None = the runaway guard's default budget. Raises CapacityError when the
        queue is full or the request cannot fit in a slot.
        """
        if max_frames is None:
            max_frames = min(
                self.config.default_frame_budget(num_text_tokens(prompt)),
                self.config.max_seq_len - prompt.prefill_len - 1,
            )
        request = EngineRequest(
            request_id=request_id,
            prompt=prompt,
            sampling=sampling,
            max_frames=max_frames,
            sink=sink,
            text_complete=text_complete,
        )
        with self._lock:
            if self._stopping:
                raise UnavailableError("talker engine is shutting down")
            self.scheduler.check_admissible(request, also_pending=len(self._inbox))
            self._inbox.append(request)
            self._wakeup.notify_all()
        return request

    async def generate(
        self,
        request_id: str,
        prompt: TalkerPrompt,
        sampling: SamplingParams,
        max_frames: int | None = None,
    ) -> AsyncIterator[EngineEvent]:
        """Submit and yield :class:`FrameEvent`s then one :class:`DoneEvent`.

        Closing the iterator early (client gone, task cancelled) cancels the request; its slot is
        freed at the next step.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

        def sink(event: EngineEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        request = self.submit(request_id, prompt, sampling, max_frames, sink)
        try:
            while True:
                event = await queue.get()
                yield event
                if isinstance(event, DoneEvent):
                    return
        finally:
            self.cancel(request)

    def call(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args)`` on the loop thread between two iterations (thread-safe).

        For the process's other torch work (e.g. building prompts): one thread for all compute
        keeps OpenMP from parking its workers between kernels (:mod:`tts_common.compute_thread`).
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        work = functools.partial(contextvars.copy_context().run, fn, *args)
        with self._lock:
            if self._stopping:
                raise UnavailableError("talker engine is shutting down")
            self._calls.append((work, future))
            self._wakeup.notify_all()
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Await :meth:`call`."""
        return await asyncio.wrap_future(self.call(fn, *args))

    def cancel(self, request: EngineRequest) -> None:
        """Ask the loop to drop ``request`` (no-op once finished)."""
        if not request.finished:
            request.cancelled.set()
            with self._lock:
                self._wakeup.notify_all()

    # --- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        adopt_torch_threads()
        while True:
            with self._lock:
                while (
                    not self._stopping
                    and not self._inbox
                    and not self._calls
                    and not self.scheduler.decodable()
                    and not any(r.cancelled.is_set() for r in self.scheduler.running.values())
                    and not any(r.cancelled.is_set() for r in self.scheduler.waiting)
                ):
                    self._wakeup.wait(timeout=0.5)
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                calls, self._calls = self._calls, []
            for work, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(work())
                    except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                        future.set_exception(exc)
            for request in inbox:
                self.scheduler.waiting.append(request)
            try:
                self._iteration()
            except Exception as exc:  # a bug or device error: fail running requests, keep serving
                logger.exception("talker engine step failed")
                for request in list(self.scheduler.running.values()):
                    self.scheduler.release(request)
                    request.finish(FinishReason.ERROR, exc)
        with self._lock:
            leftovers = list(self.scheduler.waiting) + list(self.scheduler.running.values()) + self._inbox
            self._inbox = []
            calls, self._calls = self._calls, []
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(UnavailableError("talker engine is shutting down"))
        for request in leftovers:
            self.scheduler.release(request)
            request.finish(FinishReason.CANCELLED)

    def _iteration(self) -> None:
        for request in self.scheduler.drop_cancelled():
            request.finish(FinishReason.CANCELLED)
        for request in self.scheduler.admit():
            request.timing.prefill_start = time.monotonic()
            try:
                self.runner.prefill(request)
            except Exception as exc:
                logger.exception("prefill failed for %s", request.request_id)
                self.scheduler.release(request)
                request.finish(FinishReason.ERROR, exc)
                continue
            request.timing.prefill_end = time.monotonic()
        batch = self.scheduler.decodable()
        if not batch:
            return
        t0 = time.monotonic()
        out = self.runner.step(batch)
        frames = out.frame_codes.cpu().tolist()
        eos = out.is_eos.cpu().tolist()
        now = time.monotonic()
        self.steps += 1
        self.last_batch_size = len(batch)
        for callback in self.on_step:
            callback(len(batch), now - t0)
        for request, codes, is_eos in zip(batch, frames, eos):
            if request.cancelled.is_set():
                continue  # dropped at the next iteration, within one step
            if request.timing.first_frame is None:
                request.timing.first_frame = now
            request.sink(FrameEvent(index=request.frames_emitted, codes=codes))
            request.frames_emitted += 1
            if is_eos:
                self.scheduler.release(request)
                request.finish(FinishReason.EOS)
            elif request.frames_emitted >= request.max_frames:
                self.scheduler.release(request)
                request.finish(FinishReason.LENGTH)
