"""Slot and queue bookkeeping of the talker engine (no tensors: easy to reason about and test).

Requests wait in a bounded FIFO queue, join free slots between decode steps (bounded prefill work
per iteration so running streams are not stalled), and leave on EOS, budget, error or
cancellation. The engine loop calls, once per iteration: :meth:`drop_cancelled`, :meth:`admit`
(then prefills what it returns), :meth:`decodable` (then runs one decode step for those), and
:meth:`release` for every request that finished.
"""

from __future__ import annotations

import heapq
from collections import deque

from tts_common.errors import CapacityError

from .config import EngineConfig
from .request import EngineRequest


class Scheduler:
    """Bounded waiting queue plus a fixed set of KV slots."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[EngineRequest] = deque()
        self.running: dict[int, EngineRequest] = {}
        # A min-heap: the lowest free slot is taken first, so running requests tend to occupy
        # slots 0..B-1 and the step can use cache views instead of gathering by slot index.
        self._free_slots: list[int] = list(range(config.max_slots))

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def check_admissible(self, request: EngineRequest, also_pending: int = 0) -> None:
        """Raise CapacityError if ``request`` can never fit a slot or the queue is full.

        ``also_pending``: requests accepted but not yet moved into the queue.
        """
        needed = request.prompt_len + request.max_frames + 1
        if needed > self.config.max_seq_len:
            raise CapacityError(
                f"request needs {needed} KV positions (prompt {request.prompt_len} + frame budget "
                f"{request.max_frames} + 1) but slots hold {self.config.max_seq_len}; shorten the text "
                f"or lower max_new_tokens"
            )
        if len(self.waiting) + also_pending >= self.config.max_waiting:
            raise CapacityError(
                f"talker queue is full ({self.config.max_waiting} waiting, {self.num_running} running)"
            )

    def add(self, request: EngineRequest) -> None:
        """Queue a request; raises CapacityError when the waiting queue is full or it can never fit."""
        self.check_admissible(request)
        self.waiting.append(request)

    def drop_cancelled(self) -> list[EngineRequest]:
        """Remove cancelled requests from the queue and the slots; returns them."""
        dropped = [r for r in self.waiting if r.cancelled.is_set()]
        if dropped:
            self.waiting = deque(r for r in self.waiting if not r.cancelled.is_set())
        for request in list(self.running.values()):
            if request.cancelled.is_set():
                self.release(request)
                dropped.append(request)
        return dropped

    def admit(self) -> list[EngineRequest]:
        """Move waiting requests into free slots within this iteration's prefill budget."""
        admitted: list[EngineRequest] = []
        budget = self.config.max_prefill_tokens_per_step
        while self.waiting and self._free_slots:
            request = self.waiting[0]
            if admitted and request.prompt_len > budget:
                break
            self.waiting.popleft()
            request.slot = heapq.heappop(self._free_slots)
            self.running[request.slot] = request
            admitted.append(request)
            budget -= request.prompt_len
        return admitted

    def decodable(self) -> list[EngineRequest]:
        """Running requests that can take a decode step now (slot order)."""
        return [r for _, r in sorted(self.running.items()) if not r.waiting_for_text and not r.finished]

    def release(self, request: EngineRequest) -> None:
        """Free the request's slot (idempotent)."""
        if request.slot is not None and self.running.get(request.slot) is request:
            del self.running[request.slot]
            heapq.heappush(self._free_slots, request.slot)
        request.slot = None
