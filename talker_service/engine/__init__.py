"""Continuous-batching talker engine: scheduler loop, static KV slots, whole-step CUDA graphs.

- :mod:`.config` — :class:`EngineConfig` (slots, sequence length, queue bound, buckets, budgets).
- :mod:`.scheduler` — queue and slot bookkeeping (no tensors).
- :mod:`.runner` — the slot table and one batched decode step over the model.
- :mod:`.cuda_graphs` — the CUDA-graph replay of that step (CUDA only).
- :mod:`.engine` — the loop thread and the async ``generate`` API.
"""

from .config import EngineConfig
from .engine import EngineStats, TalkerEngine
from .request import DoneEvent, EngineEvent, FinishReason, FrameEvent

__all__ = [
    "DoneEvent",
    "EngineConfig",
    "EngineEvent",
    "EngineStats",
    "FinishReason",
    "FrameEvent",
    "TalkerEngine",
]
