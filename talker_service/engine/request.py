"""A request as the talker engine sees it, and the events it delivers back."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..model.prompt import TalkerPrompt
from ..model.sampling import RequestNoise, SamplingParams


class FinishReason(enum.Enum):
    """Why a request left the engine."""

    EOS = "eos"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass
class RequestTiming:
    """Monotonic timestamps (seconds) of a request's life in the engine."""

    arrival: float = field(default_factory=time.monotonic)
    prefill_start: float | None = None
    prefill_end: float | None = None
    first_frame: float | None = None
    finished: float | None = None

    def ms(self, start: float | None, end: float | None) -> float:
        return 0.0 if start is None or end is None else (end - start) * 1000.0

    @property
    def queue_ms(self) -> float:
        return self.ms(self.arrival, self.prefill_start)

    @property
    def prefill_ms(self) -> float:
        return self.ms(self.prefill_start, self.prefill_end)

    @property
    def first_frame_ms(self) -> float:
        return self.ms(self.arrival, self.first_frame)


@dataclass
class FrameEvent:
    """One completed codec frame of a request."""

    index: int
    codes: list[int]
    """The frame's num_code_groups codes (code0 first)."""


@dataclass
class DoneEvent:
    """The request finished; no more events follow."""

    reason: FinishReason
    frames: int
    timing: RequestTiming
    error: BaseException | None = None


EngineEvent = FrameEvent | DoneEvent


@dataclass(eq=False)
class EngineRequest:
    """Mutable per-request state owned by the engine thread."""

    request_id: str
    prompt: TalkerPrompt
    sampling: SamplingParams
    max_frames: int
    """Frames this request may produce at most (official max_new_tokens M gives M-1)."""
    sink: Callable[[EngineEvent], None]
    """Called from the engine thread with each event; must be thread-safe and non-blocking."""
    timing: RequestTiming = field(default_factory=RequestTiming)
    slot: int | None = None
    frames_emitted: int = 0
    noise: RequestNoise | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    text_complete: bool = True
    """False while more text may be appended (text streamed in): the request then waits for
    trailing rows instead of feeding tts_pad once they run out, without holding back others."""

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.prefill.shape[0])

    @property
    def trailing_len(self) -> int:
        return int(self.prompt.trailing.shape[0])

    @property
    def waiting_for_text(self) -> bool:
        """Its next decode step needs a trailing text row that has not arrived yet."""
        return not self.text_complete and self.frames_emitted >= self.trailing_len

    def finish(self, reason: FinishReason, error: BaseException | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        self.timing.finished = time.monotonic()
        self.sink(DoneEvent(reason=reason, frames=self.frames_emitted, timing=self.timing, error=error))
