"""How many codec frames a request may produce: ``max_new_tokens``, or the runaway guard.

The official API counts ``max_new_tokens = M`` talker steps, of which the last can only say EOS, so
M gives at most M - 1 frames (ARCHITECTURE.md §5). A request that leaves it unset gets a budget
from its text length instead of the checkpoint's generation default (8192 steps would let a
runaway generation hold a slot for 11 minutes of audio): :data:`RUNAWAY_GUARD`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tts_common.errors import InvalidRequestError

MAX_NEW_TOKENS_CAP = 32768
"""Cap on an explicit ``max_new_tokens`` when the talker reports no limit (~43 min of audio)."""

DEFAULT_SLOT_POSITIONS = 2048
"""The talker's default slot length (``--max-seq-len``): prompt plus frames of one request."""


@dataclass(frozen=True)
class RunawayGuard:
    """Default frame budget: ``base_frames + frames_per_text_token * text tokens``."""

    base_frames: int = 125
    """10 s of audio for any text, so very short texts are never cut."""
    frames_per_text_token: int = 10
    """About 0.8 s of audio per text token, far above natural speech (0.2-0.4 s)."""

    def frames(self, text_tokens: int) -> int:
        """The default budget for a text of ``text_tokens`` tokens."""
        return self.base_frames + self.frames_per_text_token * max(text_tokens, 1)


RUNAWAY_GUARD = RunawayGuard()


def check_max_new_tokens(value: int, limit: int) -> None:
    """An explicit ``max_new_tokens`` must lie in [2, ``limit``] (``limit`` <= 0: the cap)."""
    limit = limit if limit > 0 else MAX_NEW_TOKENS_CAP
    if not 2 <= value <= limit:
        raise InvalidRequestError(
            f"sampling.max_new_tokens must be in [2, {limit}] (M steps give at most M-1 frames), got {value}"
        )


def frame_budget(
    max_new_tokens: int | None, *, text_tokens: int, room: int, guard: RunawayGuard = RUNAWAY_GUARD
) -> int:
    """Frames a request may produce.

    ``max_new_tokens``: the client's value (taken literally: M - 1 frames; whether that fits the
    talker's slot is the talker's admission check), or None for the runaway guard's budget, which
    is capped to ``room`` (the frames that fit in the request's slot after its prompt).
    """
    if max_new_tokens is not None:
        return max_new_tokens - 1
    return max(min(guard.frames(text_tokens), room), 0)


__all__ = [
    "DEFAULT_SLOT_POSITIONS",
    "MAX_NEW_TOKENS_CAP",
    "RUNAWAY_GUARD",
    "RunawayGuard",
    "check_max_new_tokens",
    "frame_budget",
]
