"""What this CPU is: its model name and feature flags (``/proc/cpuinfo``)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (x86 ``flags``, Arm
    ``Features``); empty when unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``"unknown"`` when unreadable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return "unknown"


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU has bfloat16 dot-product instructions (x86 ``avx512_bf16``/``amx_bf16``,
    Arm ``bf16``)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


__all__ = ["cpu_flags", "cpu_has_native_bf16", "cpu_model"]
