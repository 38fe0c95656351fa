"""Continuous-batching talker engine: scheduler loop, static KV slots, whole-step CUDA graphs.

- :mod:`.config` — :class:`EngineConfig` (slots, sequence length, queue bound, buckets, budgets).
- :mod:`.request` — the engine's request and the events it delivers.
- :mod:`.text_feed` — incremental text input: :class:`TextFeed` (the caller's ``append`` / ``end``)
  and the engine thread's :class:`~.text_feed.TextStream`.
- :mod:`.scheduler` — queue and slot bookkeeping (``add`` / ``schedule`` / ``update``; no tensors;
  running requests kept in slots 0..n-1).
- :mod:`.slot_table` — per-slot decode state between steps.
- :mod:`.runner` — prefill and one batched decode step over the model.
- :mod:`.cuda_graphs` — the graph path of that step: one static step per batch bucket over the
  compact slots 0..B-1, all captured at startup (CUDA graphs, or their eager CPU emulation).
- :mod:`.engine` — the loop thread, the async ``generate`` and the offline ``generate_all``.
"""

from .config import EngineConfig
from .engine import EngineStats, Generation, RequestStream, TalkerEngine
from .request import DoneEvent, EngineEvent, FinishReason, FrameEvent
from .text_feed import TextFeed

__all__ = [
    "DoneEvent",
    "EngineConfig",
    "EngineEvent",
    "EngineStats",
    "FinishReason",
    "FrameEvent",
    "Generation",
    "RequestStream",
    "TalkerEngine",
    "TextFeed",
]
