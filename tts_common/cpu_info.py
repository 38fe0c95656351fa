"""What this CPU is: its model name, generation and feature flags (``/proc/cpuinfo``)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def _first_processor_fields(cpuinfo: Path) -> dict[str, str]:
    """The ``key: value`` lines of the first processor in ``cpuinfo`` (empty when unreadable)."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (x86 ``flags``, Arm
    ``Features``); empty when unreadable."""
    fields = _first_processor_fields(cpuinfo)
    return frozenset(fields.get("flags", fields.get("Features", "")).split())


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``"unknown"`` when unreadable; any line of the file: Arm boards put
    ``Model`` after the processors)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return "unknown"


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The model name with the generation and a digest of the flags, e.g. ``"AMD EPYC (family 25,
    model 17, stepping 1, flags 3f2a9c1e)"``: cloud VMs often report a bare ``"AMD EPYC"`` for
    Zen 1 to Zen 5 alike, so what is measured on one must not be taken for another, and a report
    must say which it was."""
    fields = _first_processor_fields(cpuinfo)
    generation = ", ".join(
        f"{label} {fields[key]}"
        for key, label in (
            ("cpu family", "family"),
            ("model", "model"),
            ("stepping", "stepping"),
            ("CPU implementer", "implementer"),
            ("CPU part", "part"),
        )
        if key in fields
    )
    flags = cpu_flags(cpuinfo)
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8] if flags else ""
    detail = ", ".join(part for part in (generation, digest and f"flags {digest}") if part)
    return f"{cpu_model(cpuinfo)} ({detail})" if detail else cpu_model(cpuinfo)


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU has bfloat16 dot-product instructions (x86 ``avx512_bf16``/``amx_bf16``,
    Arm ``bf16``)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


__all__ = ["cpu_flags", "cpu_has_native_bf16", "cpu_identity", "cpu_model"]
