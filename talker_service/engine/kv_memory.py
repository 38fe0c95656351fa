"""Sizing the talker's KV cache from a memory budget.

The number of KV slots (requests decoded at once) follows ``--kv-memory``: a fraction of the
memory available once the weights are loaded, or a byte count (:mod:`tts_common.memory`). Each
slot holds ``max_seq_len`` positions of K and V for every talker layer, so

    slots = min(max_slots, budget // bytes_per_slot)

and a budget that holds no slot at all is a startup error naming the flags to change.

The budget bounds the cache when every slot is full. On CPU (no captured graph) the cache is
lazily committed (:meth:`~talker_service.model.talker.KVCache.allocate`): an idle talker holds
its weights and little else, and a slot costs the positions its requests reach. With CUDA graphs the cache is
allocated whole up front, as the graphs need fixed addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_common.config import TalkerConfig
from tts_common.memory import available_memory, device_total_memory, format_bytes

from .config import EngineConfig


class KVBudgetError(ValueError):
    """The memory budget holds no KV slot (a configuration error at startup)."""


def kv_bytes_per_position(cfg: TalkerConfig, dtype: torch.dtype) -> int:
    """Bytes of talker K and V one position of one slot takes (all layers)."""
    assert cfg.head_dim is not None
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * element


@dataclass(frozen=True)
class KVPlan:
    """The KV cache an engine allocates: ``slots`` requests of ``positions`` positions each."""

    slots: int
    positions: int
    bytes_per_slot: int
    budget: int
    """Bytes the cache may take (the resolved ``--kv-memory``)."""
    other_stages: int = 0
    """The co-located stages' share the budget was planned after (``--other-stages-memory``)."""

    @property
    def total_bytes(self) -> int:
        """Bytes of the cache with every slot full (what the budget bounds)."""
        return self.slots * self.bytes_per_slot

    def describe(self) -> str:
        """The startup log line."""
        shares = (
            f", after {format_bytes(self.other_stages)} for the stages beside it" if self.other_stages else ""
        )
        return (
            f"KV cache: {self.slots} slots x {self.positions} positions, "
            f"{format_bytes(self.total_bytes)} of {format_bytes(self.budget)} budget{shares}"
        )


def _available_for_talker(config: EngineConfig) -> int:
    """What a --kv-memory fraction is of: with ``other_stages_memory`` on CUDA, the device's total
    less the other stages' share and what this process holds now (its weights), so the plan does
    not depend on which stage loaded first; otherwise the available memory less that share."""
    total = device_total_memory(config.device) if config.other_stages_memory else None
    if total is not None:
        held = torch.cuda.memory_reserved(torch.device(config.device))
        return max(0, total - held - config.other_stages_memory)
    return max(0, available_memory(config.device) - config.other_stages_memory)


def plan_kv_cache(
    cfg: TalkerConfig, config: EngineConfig, dtype: torch.dtype, available: int | None = None
) -> KVPlan:
    """The slot count ``config.kv_memory`` allows (at most ``config.max_slots``).

    ``available``: bytes available on the engine's device (default: measured now, see
    :func:`tts_common.memory.available_memory`; measure after loading the weights). Raises
    :class:`KVBudgetError` when the budget holds no slot.
    """
    per_slot = config.max_seq_len * kv_bytes_per_position(cfg, dtype)
    if config.kv_memory.fraction is not None and available is None:
        available = _available_for_talker(config)
    elif available is not None:
        available = max(0, available - config.other_stages_memory)
    budget = config.kv_memory.resolve(available or 0)
    fit = budget // per_slot
    if fit < 1:
        of_what = "" if available is None else f" of {format_bytes(available)} available"
        raise KVBudgetError(
            f"--kv-memory {config.kv_memory} ({format_bytes(budget)}{of_what}) holds no KV slot of "
            f"{config.max_seq_len} positions ({format_bytes(per_slot)} needed); "
            "raise --kv-memory or lower --max-seq-len"
        )
    return KVPlan(
        slots=min(config.max_slots, fit),
        positions=config.max_seq_len,
        bytes_per_slot=per_slot,
        budget=budget,
        other_stages=config.other_stages_memory,
    )


__all__ = [
    "KVBudgetError",
    "KVPlan",
    "kv_bytes_per_position",
    "plan_kv_cache",
]
