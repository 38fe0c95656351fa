"""Typed configuration of the talker engine (also the talker process's engine flags, see
:mod:`talker_service.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts_common.flags import NOT_A_FLAG, flag
from tts_common.synthesis import DEFAULT_SLOT_POSITIONS, RUNAWAY_GUARD, RunawayGuard


@dataclass
class EngineConfig:
    """How many requests the talker engine runs at once and how it schedules them."""

    max_slots: int = 16
    """Requests decoded concurrently (static KV slots preallocated for each)."""
    max_seq_len: int = DEFAULT_SLOT_POSITIONS
    """Talker KV positions per slot: prompt length plus frame budget must fit."""
    max_waiting: int = 64
    """Requests allowed to wait for a slot; more are refused (RESOURCE_EXHAUSTED)."""
    batch_buckets: tuple[int, ...] = field(default=(1, 2, 4, 8, 16), metadata=NOT_A_FLAG)
    """Batch sizes a decode step is padded to on CUDA (one captured graph each)."""
    max_prefill_tokens_per_step: int = field(default=256, metadata=NOT_A_FLAG)
    """Prompt positions prefilled between two decode steps (at least one whole request), so that
    newcomers never stall running streams for much more than one step."""
    use_cuda_graphs: bool = field(default=True, metadata=flag(name="--no-cuda-graphs", negate=True))
    """Capture the whole decode step as one CUDA graph per batch bucket (CUDA only)."""
    runaway_guard: RunawayGuard = field(default=RUNAWAY_GUARD, metadata=NOT_A_FLAG)
    """Frame budget of requests that leave max_new_tokens unset (capped to what fits a slot)."""
    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)

    def frames_that_fit(self, prompt_len: int) -> int:
        """Frames a slot holds after a prompt of ``prompt_len`` positions (one kept spare)."""
        return self.max_seq_len - prompt_len - 1

    def bucket_for(self, batch: int) -> int:
        """Smallest configured bucket that holds ``batch`` rows (``batch`` itself past the last)."""
        for bucket in sorted(self.batch_buckets):
            if bucket >= batch:
                return bucket
        return batch
