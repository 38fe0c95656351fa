"""Host and device memory: budgets given on the command line, what is available, lazily committed
CPU buffers and a process's resident size.

A memory budget (``--kv-memory``) is written either as a fraction of the memory available when
it is resolved (``0.5``; like vLLM's ``gpu_memory_utilization``, for CPU RAM and GPU memory
alike) or as a byte count with a unit (``4GiB``, ``512MiB``, ``8GB``, ``1073741824B``). A bare
number above 1 is refused: "2" could mean bytes or gibibytes, and guessing wrong sizes a cache by
a factor of 2**30.

Lazily committed buffers (:func:`lazy_zeros`): on CPU a tensor backed by a private anonymous
mapping reads as zeros and takes physical memory only for the pages that are written (or read:
reads of untouched pages map the kernel's shared zero page, which is not resident memory of the
process). A KV cache sized for the longest request therefore costs only the positions requests
actually reach.
"""

from __future__ import annotations

import argparse
import math
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
}
_BUDGET = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>[a-zA-Z]*)\s*$")


@dataclass(frozen=True)
class MemoryBudget:
    """How much memory a buffer may take: ``fraction`` of what is available, or ``nbytes``
    (exactly one is set)."""

    fraction: float | None = None
    nbytes: int | None = None

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.nbytes is None):
            raise ValueError("a MemoryBudget is a fraction or a byte count, exactly one of them")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"a memory fraction must be in (0, 1], got {self.fraction}")
        if self.nbytes is not None and self.nbytes <= 0:
            raise ValueError(f"a memory budget must be > 0 bytes, got {self.nbytes}")

    def resolve(self, available: int) -> int:
        """The budget in bytes when ``available`` bytes are available."""
        if self.nbytes is not None:
            return self.nbytes
        assert self.fraction is not None
        return int(self.fraction * max(available, 0))

    def __str__(self) -> str:
        """The budget as it is written on the command line (round trips through
        :func:`parse_memory_budget`)."""
        if self.fraction is not None:
            return repr(self.fraction)
        assert self.nbytes is not None
        for unit in ("TiB", "GiB", "MiB", "KiB"):
            scale = _UNITS[unit.lower()]
            if self.nbytes % scale == 0:
                return f"{self.nbytes // scale}{unit}"
        return f"{self.nbytes}B"


def parse_memory_budget(text: str) -> MemoryBudget:
    """``"0.5"`` -> half of the available memory; ``"4GiB"``/``"4G"`` -> 4 * 2**30 bytes,
    ``"4GB"`` -> 4 * 10**9 bytes, ``"100B"`` -> 100 bytes. Raises ArgumentTypeError (a usage
    error naming the flag) for anything else."""
    match = _BUDGET.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid memory budget {text!r}: give a fraction of the available memory in (0, 1] "
            "(e.g. 0.5) or a size with a unit (e.g. 4GiB, 512MiB, 8GB)"
        )
    number = float(match["number"])
    unit = match["unit"].lower()
    if not unit:
        if not 0 < number <= 1:
            raise argparse.ArgumentTypeError(
                f"invalid memory budget {text!r}: a bare number is a fraction of the available "
                "memory and must be in (0, 1]; write a size with its unit, e.g. 4GiB"
            )
        return MemoryBudget(fraction=number)
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid memory budget {text!r}: unknown unit {match['unit']!r} "
            "(use B, KiB, MiB, GiB, TiB or kB, MB, GB, TB)"
        )
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise argparse.ArgumentTypeError(f"invalid memory budget {text!r}: must be at least 1 byte")
    return MemoryBudget(nbytes=int(size))


def parse_size(text: str) -> int:
    """A size with a unit as :func:`parse_memory_budget` reads it (``"3GiB"``), or ``"0"``:
    bytes. Raises ArgumentTypeError otherwise (a fraction means nothing here)."""
    if text.strip() == "0":
        return 0
    budget = parse_memory_budget(text)
    if budget.nbytes is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a size with a unit, e.g. 3GiB, or 0")
    return budget.nbytes


def device_total_memory(device: torch.device | str) -> int | None:
    """Total memory of a CUDA device (None elsewhere)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[1])


def format_bytes(n: int) -> str:
    """``n`` bytes with two decimals in GiB from 1 GiB (``"1.50 GiB"``), in MiB below."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.2f} MiB"


# ---------------------------------------------------------------------------------------------
# What is available


def _meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this cgroup (v2) may still allocate under its ``memory.max``, or None without a
    limit: a container's /proc/meminfo shows the host's memory, not its own limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        usage = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return max(int(limit) - usage, 0)


def available_memory(device: torch.device | str) -> int:
    """Bytes that can still be allocated on ``device`` now: free GPU memory on CUDA; on CPU the
    kernel's MemAvailable, lowered to the container's headroom under a cgroup limit."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        raise ValueError(f"no memory accounting for device {device}")
    candidates = [n for n in (_meminfo_available(), _cgroup_headroom()) if n is not None]
    if not candidates:
        raise RuntimeError("cannot read the available memory (/proc/meminfo); give a byte count")
    return min(candidates)


# ---------------------------------------------------------------------------------------------
# Lazily committed CPU buffers


def lazy_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A zero tensor that, on CPU, takes physical memory only as its pages are written (see the
    module docstring); elsewhere ``torch.zeros``.

    The mapping is private (a shared one would commit pages on read) and opts out of transparent
    huge pages: with THP one touched position would commit 2 MiB of its neighbours.
    """
    device = torch.device(device)
    numel = math.prod(shape)
    if device.type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    # The tensor keeps the mapping alive; it is unmapped when the last view goes.
    return torch.frombuffer(region, dtype=dtype, count=numel).view(shape)


# ---------------------------------------------------------------------------------------------
# Resident memory


def resident_bytes(pid: int | None = None) -> int:
    """Resident set size (VmRSS) of process ``pid`` (default: this one), from /proc."""
    status = Path(f"/proc/{pid if pid is not None else os.getpid()}/status")
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in {status}")


__all__ = [
    "MemoryBudget",
    "available_memory",
    "device_total_memory",
    "format_bytes",
    "lazy_zeros",
    "parse_memory_budget",
    "parse_size",
    "resident_bytes",
]
