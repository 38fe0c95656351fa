"""Slot and queue bookkeeping of the talker engine, in the shape of vLLM v1's scheduler (no
tensors: easy to reason about and to test).

The engine loop calls, once per iteration:

* :meth:`Scheduler.add` for each request that arrived (its prompt already built): refused with
  CapacityError if it can never fit a slot;
* :meth:`Scheduler.schedule` -> :class:`SchedulerOutput`: the cancelled requests it dropped, the
  requests it admitted into free slots (to prefill now, together, within a budget of prompt
  positions and, while streams run, of requests, so running streams are not stalled) and the
  running requests that decode this step (the new ones included);
* :meth:`Scheduler.update` with the step's EOS flags -> the requests that finished (EOS or frame
  budget), their slots freed.

Requests wait in a bounded FIFO queue. Running requests always occupy slots 0..n-1: a newcomer
takes slot n (the lowest free one), and when a request leaves a lower slot the one in the highest
slot moves into the hole (``on_move(request, src, dst)`` tells the runner to copy that slot's KV
rows and state: one copy per finish). So every step reads the cache through views of slots
0..B-1 (a bucket-B CUDA graph included) instead of gathering each row's slot, and the graph path
needs no scratch slot: its padding rows are free slots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tts_common.errors import CapacityError

from .config import EngineConfig
from .request import EngineRequest, FinishReason


@dataclass
class SchedulerOutput:
    """What one engine iteration does."""

    aborted: list[EngineRequest] = field(default_factory=list)
    """Cancelled requests removed from the queue or their slot."""
    prefill: list[EngineRequest] = field(default_factory=list)
    """Requests given a slot now: prefill them (together) before the decode step."""
    decode: list[EngineRequest] = field(default_factory=list)
    """Requests that take this decode step (slot order; the newly prefilled ones included)."""


SlotMove = Callable[[EngineRequest, int, int], None]
"""``on_move(request, src, dst)``: ``request`` now lives in slot ``dst`` instead of ``src``."""


class Scheduler:
    """Bounded waiting queue plus a fixed set of KV slots, kept compact (slots 0..n-1)."""

    def __init__(self, config: EngineConfig, on_move: SlotMove | None = None) -> None:
        self.config = config
        self.on_move = on_move
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[int, EngineRequest] = {}

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def requests(self) -> list[EngineRequest]:
        """Every request the scheduler holds: waiting, then running from the highest slot down
        (removing them in this order moves no slot)."""
        return [*self._waiting, *(self._running[s] for s in sorted(self._running, reverse=True))]

    def check_queue(self, pending: int = 0) -> None:
        """CapacityError if the waiting queue (plus ``pending`` requests on their way into it)
        is full."""
        if len(self._waiting) + pending >= self.config.max_waiting:
            raise CapacityError(
                f"talker queue is full ({self.config.max_waiting} waiting, {self.num_running} running)"
            )

    def add(self, request: EngineRequest) -> None:
        """Queue a request whose prompt and frame budget are set; CapacityError if it can never
        fit a slot (the queue bound is checked on submission, :meth:`check_queue`)."""
        room = self.config.frames_that_fit(request.prompt_len)
        if room < 1:
            raise CapacityError(
                f"the prompt ({request.prompt_len} positions) leaves no room for audio in a "
                f"{self.config.max_seq_len}-position slot; shorten the text"
            )
        if request.max_frames > room:
            needed = (
                self.config.max_seq_len - self.config.frames_that_fit(request.prompt_len) + request.max_frames
            )
            raise CapacityError(
                f"request needs {needed} KV positions (prompt {request.prompt_len} + frame budget "
                f"{request.max_frames} + 1) but slots hold {self.config.max_seq_len}; shorten the text "
                "or lower max_new_tokens"
            )
        self._waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        """Drop cancelled requests, admit waiting ones into free slots within the prefill budget,
        and list the running requests that can take a decode step."""
        out = SchedulerOutput()
        if any(r.cancelled.is_set() for r in self._waiting):
            out.aborted = [r for r in self._waiting if r.cancelled.is_set()]
            self._waiting = deque(r for r in self._waiting if not r.cancelled.is_set())
        for slot in sorted(self._running, reverse=True):  # highest first: fewest moves
            request = self._running[slot]
            if request.cancelled.is_set():
                self._release(request)
                out.aborted.append(request)
        budget = self.config.max_prefill_tokens_per_step
        # Bounded by requests too while streams run (they wait for every prefill of the iteration).
        streams_running = any(not r.waiting_for_text for r in self._running.values())
        while self._waiting and self._has_free_slot:
            request = self._waiting[0]
            if out.prefill and request.prompt_len > budget:
                break
            if streams_running and len(out.prefill) >= self.config.max_prefills_per_step:
                break
            self._waiting.popleft()
            request.slot = len(self._running)  # the lowest free slot
            self._running[request.slot] = request
            out.prefill.append(request)
            budget -= request.prompt_len
        out.decode = [r for _, r in sorted(self._running.items()) if not r.waiting_for_text]
        return out

    def has_work(self) -> bool:
        """Whether :meth:`schedule` would do anything now (the loop sleeps otherwise)."""
        if any(r.cancelled.is_set() for r in self.requests):
            return True
        if self._waiting and self._has_free_slot:
            return True
        return any(not r.waiting_for_text for r in self._running.values())

    def update(
        self, decoded: Sequence[EngineRequest], eos: Sequence[bool]
    ) -> list[tuple[EngineRequest, FinishReason]]:
        """Account one decode step: each request in ``decoded`` produced one frame, ``eos[i]``
        telling whether it was the last. Returns the finished requests (slots freed) and why.
        Requests cancelled during the step are left for the next :meth:`schedule`."""
        finished: list[tuple[EngineRequest, FinishReason]] = []
        for request, is_eos in zip(decoded, eos):
            if request.cancelled.is_set() or request.finished:
                continue
            request.frames_emitted += 1
            if is_eos:
                finished.append((request, FinishReason.EOS))
            elif request.frames_emitted >= request.max_frames:
                finished.append((request, FinishReason.LENGTH))
        for request, _ in sorted(finished, key=lambda f: -(f[0].slot or 0)):  # highest slot first
            self._release(request)
        return finished

    def remove(self, request: EngineRequest) -> None:
        """Take ``request`` out (its prefill failed, or the engine stops); idempotent."""
        if request in self._waiting:
            self._waiting.remove(request)
        self._release(request)

    @property
    def _has_free_slot(self) -> bool:
        return len(self._running) < self.config.max_slots

    def _release(self, request: EngineRequest) -> None:
        hole = request.slot
        if hole is not None and self._running.get(hole) is request:
            del self._running[hole]
            last = len(self._running)  # the highest occupied slot
            if hole < last:  # keep slots 0..n-1 occupied: the last request fills the hole
                mover = self._running.pop(last)
                mover.slot = hole
                self._running[hole] = mover
                if self.on_move is not None:
                    self.on_move(mover, last, hole)
        request.slot = None
