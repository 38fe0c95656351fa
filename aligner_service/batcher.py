"""Batching across concurrent Align calls: the first waiting utterance opens a batch, which takes
every utterance that arrives within ``wait_s`` (up to ``max_batch``); the batch runs as ONE
forward pass on the stage's compute thread and each caller gets its own row back.

The aligner is non-autoregressive (one forward per utterance), so there is no step loop to join:
a batch is collected, run and split, and the next batch is collected while nothing else runs (a
single compute thread, tts_common/compute_thread.py).

A batch whose forward pass raises is run again one utterance at a time, so one unusable input
(the model refuses it with a ``ValueError``) fails only its own call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tts_common import metrics
from tts_common.compute_thread import ComputeThread
from tts_common.errors import CapacityError

logger = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True)
class BatchResult(Generic[ResultT]):
    """One caller's row of a forward pass."""

    value: ResultT
    forward_ms: float
    """Wall time of the forward pass that carried it (shared with its batch)."""
    batch_size: int
    """Utterances in that forward pass."""


@dataclass
class _Job(Generic[ItemT, ResultT]):
    item: ItemT
    future: asyncio.Future[BatchResult[ResultT]]
    queued_at: float = field(default_factory=time.perf_counter)


class Batcher(Generic[ItemT, ResultT]):
    """Collects items from concurrent callers into batches for ``run_batch`` (called on
    ``compute``; it returns one result per item, in order)."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[ItemT]], Sequence[ResultT]],
        compute: ComputeThread,
        *,
        max_batch: int,
        wait_s: float,
        max_waiting: int,
        stage: str = metrics.STAGE_ALIGNER,
    ) -> None:
        self._run_batch = run_batch
        self._compute = compute
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.max_waiting = max_waiting
        self._stage = stage
        self._queue: asyncio.Queue[_Job[ItemT, ResultT]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._taken: list[_Job[ItemT, ResultT]] = []
        # Jobs off the queue in the batch being collected or run: stop() must settle them too.
        self.running = 0
        """Items in the forward pass running now."""

    @property
    def waiting(self) -> int:
        """Items queued for a forward pass."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start collecting batches (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"{self._stage}-batcher")

    async def stop(self) -> None:
        """Stop collecting; every caller still waiting (queued, in the batch being collected or
        in the forward pass) is cancelled."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        held = [*self._taken, *(self._queue.get_nowait() for _ in range(self._queue.qsize()))]
        self._taken = []
        for job in held:
            if not job.future.done():
                job.future.cancel()

    async def submit(self, item: ItemT) -> BatchResult[ResultT]:
        """Run ``item`` in the next batch that has room and return its row."""
        if self._task is None:
            raise RuntimeError("the batcher is not started")
        if self._queue.qsize() >= self.max_waiting:
            raise CapacityError(f"{self._stage} stage is busy ({self._queue.qsize()} utterances waiting)")
        job: _Job[ItemT, ResultT] = _Job(item, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        self._gauges()
        return await job.future

    def _gauges(self) -> None:
        metrics.WAITING_REQUESTS.labels(stage=self._stage).set(self._queue.qsize())
        metrics.RUNNING_REQUESTS.labels(stage=self._stage).set(self.running)

    async def _collect(self) -> list[_Job[ItemT, ResultT]]:
        batch = self._taken = [await self._queue.get()]
        deadline = time.perf_counter() + self.wait_s
        while len(batch) < self.max_batch:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                while len(batch) < self.max_batch and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        # A caller that gave up (cancelled RPC) while queued needs no forward pass.
        return [job for job in batch if not job.future.done()]

    async def _loop(self) -> None:
        while True:
            batch = await self._collect()
            if not batch:
                continue
            now = time.perf_counter()
            for job in batch:
                metrics.QUEUE_TIME.labels(stage=self._stage).observe(now - job.queued_at)
            self.running = len(batch)
            self._gauges()
            try:
                await self._run(batch)
                self._taken = []  # all settled (not on cancellation: stop() settles them)
            finally:
                self.running = 0
                self._gauges()

    async def _run(self, batch: list[_Job[ItemT, ResultT]]) -> None:
        items = [job.item for job in batch]
        start = time.perf_counter()
        try:
            results = await self._compute.run(self._run_batch, items)
            if len(results) != len(items):
                raise RuntimeError(f"the model returned {len(results)} results for {len(items)} inputs")
        except Exception as exc:  # noqa: BLE001 - handed to the callers, or retried one by one
            if len(batch) > 1:
                logger.info("a batch of %d failed (%s); running its utterances one by one", len(batch), exc)
                for job in batch:
                    if not job.future.done():  # its caller may have given up meanwhile
                        await self._run([job])
                return
            _settle(batch[0].future, exc=exc)
            return
        forward_s = time.perf_counter() - start
        metrics.BATCH_SIZE.labels(stage=self._stage).observe(len(batch))
        metrics.STEP_DURATION.labels(stage=self._stage).observe(forward_s)
        for job, value in zip(batch, results):
            _settle(job.future, BatchResult(value, forward_s * 1000.0, len(batch)))


def _settle(future: asyncio.Future, result: object = None, *, exc: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


__all__ = ["BatchResult", "Batcher"]
