"""Typed configuration of the talker engine (also the talker process's engine flags, see
:mod:`talker_service.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts_common.flags import NOT_A_FLAG, flag


@dataclass
class EngineConfig:
    """How many requests the talker engine runs at once and how it schedules them."""

    max_slots: int = 16
    """Requests decoded concurrently (static KV slots preallocated for each)."""
    max_seq_len: int = 2048
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
    default_budget_base_frames: int = field(default=125, metadata=NOT_A_FLAG)
    """Runaway guard: default frame budget = base + per_token * text tokens (capped by max_seq_len)."""
    default_budget_frames_per_token: int = field(default=10, metadata=NOT_A_FLAG)
    """About 0.8 s of audio per text token, far above natural speech (0.2-0.4 s)."""
    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)

    def bucket_for(self, batch: int) -> int:
        """Smallest configured bucket that holds ``batch`` rows (``batch`` itself past the last)."""
        for bucket in sorted(self.batch_buckets):
            if bucket >= batch:
                return bucket
        return batch

    def default_frame_budget(self, num_text_tokens: int) -> int:
        """Frames a request may produce when it does not set max_new_tokens."""
        return self.default_budget_base_frames + self.default_budget_frames_per_token * num_text_tokens
