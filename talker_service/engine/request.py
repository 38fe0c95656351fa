"""A request as the talker engine sees it, and the events it delivers back."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tts_common.synthesis import SamplingParams

from ..model.prompt import PromptInputs, TalkerPrompt
from ..model.sampling import RequestNoise

if TYPE_CHECKING:
    from .text_feed import TextFeed, TextStream


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
    text_wait: float = 0.0
    """Seconds the request held its slot waiting for text (open text only)."""
    stalls: int = 0
    """Times it had to wait for text: frames delayed by the text's arrival (open text only)."""

    @staticmethod
    def ms(start: float | None, end: float | None) -> float:
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
    prompt_len: int = 0
    """Prefill length in positions (0 if the prompt was never built)."""
    error: BaseException | None = None


EngineEvent = FrameEvent | DoneEvent
EventSink = Callable[[EngineEvent], None]
"""Called from the engine thread with each event; must be thread-safe and non-blocking."""


@dataclass(eq=False)
class EngineRequest:
    """One generation and its mutable state, owned by the engine thread once added."""

    request_id: str
    source: PromptInputs | TalkerPrompt
    """What to speak: prompt inputs (the prompt is built when the engine admits the request) or a
    ready-made prompt (benchmarks)."""
    sampling: SamplingParams
    max_new_tokens: int | None
    """The client's budget (M steps give at most M-1 frames), or None for the runaway guard."""
    sink: EventSink
    timing: RequestTiming = field(default_factory=RequestTiming)
    prompt: TalkerPrompt | None = None
    """Built on admission."""
    max_frames: int = 0
    """Frames this request may produce (``tts_common.synthesis.frame_budget``), set on admission."""
    slot: int | None = None
    frames_emitted: int = 0
    noise: RequestNoise | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    text_complete: bool = True
    """False while more text may be appended (text streamed in): the request then waits for
    trailing rows instead of feeding tts_pad once they run out, without holding back others."""
    text_feed: TextFeed | None = None
    """The caller's side of an open text (:mod:`.text_feed`), else None."""
    text: TextStream | None = None
    """The engine thread's side of an open text, set on admission."""
    waiting_since: float | None = None
    """When the current wait for text began (None while not waiting)."""

    @property
    def prompt_len(self) -> int:
        return 0 if self.prompt is None else self.prompt.prefill_len

    @property
    def waiting_for_text(self) -> bool:
        """Its next decode step needs a trailing text row that has not arrived yet."""
        assert self.prompt is not None
        return not self.text_complete and self.frames_emitted >= self.prompt.trailing.shape[0]

    def finish(self, reason: FinishReason, error: BaseException | None = None) -> None:
        """Deliver the final event (once)."""
        if self.finished:
            return
        self.finished = True
        self.timing.finished = time.monotonic()
        if self.waiting_since is not None:
            self.timing.text_wait += self.timing.finished - self.waiting_since
            self.waiting_since = None
        self.sink(
            DoneEvent(
                reason=reason,
                frames=self.frames_emitted,
                timing=self.timing,
                prompt_len=self.prompt_len,
                error=error,
            )
        )
