"""One memory plan per device: each stage's share explicit, the talker's KV cache after the rest.

Stages that share a device (talker, decoder, speaker) each load on their own, so without a plan
whichever loads first takes what it sees free. The plan states, for one device: what is kept free
(``reserve``: fragmentation, the CUDA contexts' growth), each co-located stage's share (weights,
graph pools, activations), the talker's own fixed share (weights, graph pool), and what remains:
the talker's KV budget, hence its slots. ``qwen3-tts doctor`` prints it from measured figures;
the talker's ``--kv-memory`` is the operator's way to apply it (a size such as ``6GiB``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory import format_bytes

CUDA_CONTEXT_BYTES = 512 * 2**20
"""A process's CUDA context and library workspaces (cuBLAS, cuDNN), roughly, per stage."""


@dataclass
class StageShare:
    """Device memory one stage needs besides the talker's KV cache."""

    stage: str
    bytes: int
    parts: dict[str, int] = field(default_factory=dict)
    """What the share is made of (weights, graph pool, context, ...)."""


@dataclass
class MemoryPlan:
    """The plan of one device (see the module docstring)."""

    device: str
    total: int
    reserve: int
    shares: list[StageShare]
    kv_bytes_per_slot: int
    kv_budget: int
    slots: int

    def describe(self) -> list[str]:
        """The plan as log/report lines."""
        lines = [
            f"memory plan of {self.device}: {format_bytes(self.total)} total, {format_bytes(self.reserve)} kept free"
        ]
        for share in self.shares:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in share.parts.items())
            lines.append(f"  {share.stage}: {format_bytes(share.bytes)} ({parts})")
        lines.append(
            f"  talker KV: {format_bytes(self.kv_budget)} -> {self.slots} slots of "
            f"{format_bytes(self.kv_bytes_per_slot)} (talker: --kv-memory {self.kv_budget // 2**20}MiB "
            f"--other-stages-memory {self.other_stages // 2**20}MiB)"
        )
        return lines

    @property
    def other_stages(self) -> int:
        """The shares of the stages beside the talker (its ``--other-stages-memory``)."""
        return sum(s.bytes for s in self.shares if not s.stage.startswith("talker"))

    def to_dict(self) -> dict[str, object]:
        return {
            "device": self.device,
            "total_bytes": self.total,
            "reserve_bytes": self.reserve,
            "shares": [{"stage": s.stage, "bytes": s.bytes, "parts": s.parts} for s in self.shares],
            "kv_bytes_per_slot": self.kv_bytes_per_slot,
            "kv_budget_bytes": self.kv_budget,
            "slots": self.slots,
        }


def plan_device(
    device: str, total: int, shares: list[StageShare], kv_bytes_per_slot: int, reserve_fraction: float = 0.1
) -> MemoryPlan:
    """The talker's KV budget on a device of ``total`` bytes after ``reserve_fraction`` of it and
    every stage's share; ``slots`` = how many KV slots that holds (0: the stages do not fit)."""
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), not {reserve_fraction}")
    reserve = int(total * reserve_fraction)
    budget = max(0, total - reserve - sum(s.bytes for s in shares))
    return MemoryPlan(
        device, total, reserve, shares, kv_bytes_per_slot, budget, budget // max(kv_bytes_per_slot, 1)
    )


__all__ = ["CUDA_CONTEXT_BYTES", "MemoryPlan", "StageShare", "plan_device"]
