"""Capturing static-shape steps as CUDA graphs in ONE memory pool, or emulating that on CPU.

Both model stages (talker decode step, decoder streaming step) replay a step whose inputs and
outputs live at fixed addresses. :class:`StepCapture` is the one place that knows how:

* ``mode="cuda"``: each step is warmed up on a side stream (allocator, cuBLAS handles, lazy
  caches, torch.compile), then captured with ``torch.cuda.graph(..., pool=<the shared pool>)``.
  Callers capture every shape at startup, **largest first**: the first capture sizes the pool,
  later (smaller) ones reuse its freed blocks. Sharing one pool is safe here because no two graphs
  of a process ever run concurrently and every graph's outputs are consumed before the next replay
  (a later replay may reuse an earlier graph's output memory as its scratch space). Persistent
  state (KV cache, slot table, static inputs) is allocated outside the pool, before capture.
* ``mode="emulated"`` (any device; what CPU CI runs): "capture" runs the step once and keeps its
  outputs as the static outputs; "replay" runs the same step eagerly on the same static input
  buffers and copies the results into those static outputs. Everything around a graph (bucket
  choice, padding rows, copies in and out, bucket switches) is thereby exercised without a GPU; only
  the CUDA capture itself (the thin ``mode="cuda"`` branch below) needs one.

:class:`CaptureReport` says what was captured and what it cost in device memory (the pool plus any
other memory the captures kept), so that a memory budget can count it (one budget per device).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")
CaptureMode = Literal["cuda", "emulated"]


@dataclass
class CapturedStep(Generic[T]):
    """One captured step: ``replay()`` reruns it on its static inputs and returns its static
    outputs (the same tensors every time: read them before the next replay of any graph)."""

    name: str
    outputs: T
    _replay: Callable[[], None]
    replays: int = 0

    def replay(self) -> T:
        self._replay()
        self.replays += 1
        return self.outputs


@dataclass
class CaptureReport:
    """What :meth:`StepCapture.capture_all` captured and what it cost."""

    mode: CaptureMode
    names: list[str] = field(default_factory=list)
    """Captured steps in capture order (largest first)."""
    seconds: float = 0.0
    pool_bytes: int = 0
    """Device memory still held after capture (the graphs' pool and what the captures kept);
    0 when emulated. Count it in the device's memory budget next to weights and KV cache."""
    peak_bytes: int = 0
    """Extra device memory at the peak of capturing (warm-up activations included); 0 when
    emulated. Startup needs this much free on top of everything allocated before."""

    def summary(self) -> str:
        return (
            f"{len(self.names)} {self.mode} graphs in {self.seconds:.1f} s, "
            f"{self.pool_bytes / 2**20:.0f} MiB held ({self.peak_bytes / 2**20:.0f} MiB peak)"
        )


def _same_shapes(static: object, new: object) -> bool:
    if isinstance(static, torch.Tensor):
        return isinstance(new, torch.Tensor) and static.shape == new.shape and static.dtype == new.dtype
    if isinstance(static, (tuple, list)):
        return (
            isinstance(new, (tuple, list))
            and len(static) == len(new)
            and all(_same_shapes(a, b) for a, b in zip(static, new))
        )
    if isinstance(static, dict):
        return (
            isinstance(new, dict)
            and static.keys() == new.keys()
            and all(_same_shapes(static[k], new[k]) for k in static)
        )
    return static == new


def _copy_into(static: object, new: object) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(new)  # type: ignore[arg-type]
    elif isinstance(static, (tuple, list)):
        for a, b in zip(static, new):  # type: ignore[call-overload]
            _copy_into(a, b)
    elif isinstance(static, dict):
        for k in static:
            _copy_into(static[k], new[k])  # type: ignore[index]


class StepCapture:
    """Captures steps (functions of static buffers returning tensors) in one pool; see the
    module docstring for the two modes."""

    def __init__(self, device: torch.device | str, mode: CaptureMode, warmup: int = 2) -> None:
        self.device = torch.device(device)
        if mode == "cuda" and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a cuda device, not {self.device}")
        self.mode: CaptureMode = mode
        self.warmup = warmup
        self._pool = torch.cuda.graph_pool_handle() if mode == "cuda" else None

    def capture(self, name: str, step: Callable[[], T]) -> CapturedStep[T]:
        """Capture one step (its static inputs must already hold valid values)."""
        if self.mode == "emulated":
            outputs = step()

            def replay() -> None:
                new = step()
                if not _same_shapes(outputs, new):
                    raise RuntimeError(f"step {name!r} changed its output shapes between replays")
                _copy_into(outputs, new)

            return CapturedStep(name, outputs, replay)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                step()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = step()
        return CapturedStep(name, outputs, graph.replay)

    def capture_all(
        self, steps: Sequence[tuple[str, Callable[[], T]]], what: str
    ) -> tuple[dict[str, CapturedStep[T]], CaptureReport]:
        """Capture ``steps`` in the given order (callers pass largest first) and log the cost."""
        report = CaptureReport(self.mode)
        t0 = time.perf_counter()
        before = self.reserved_bytes()
        if self.mode == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        captured: dict[str, CapturedStep[T]] = {}
        for name, step in steps:
            captured[name] = self.capture(name, step)
            report.names.append(name)
        if self.mode == "cuda":
            torch.cuda.synchronize(self.device)
            report.peak_bytes = max(0, torch.cuda.max_memory_reserved(self.device) - before)
        report.pool_bytes = max(0, self.reserved_bytes() - before)
        report.seconds = time.perf_counter() - t0
        logger.info("%s: captured %s: %s", what, report.summary(), ", ".join(report.names))
        return captured, report

    def reserved_bytes(self) -> int:
        """Device memory reserved by torch with no cached free blocks (0 when emulated): the
        difference across the captures is what they keep (the warm-up activations are freed)."""
        if self.mode != "cuda":
            return 0
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved(self.device)


__all__ = ["CaptureMode", "CaptureReport", "CapturedStep", "StepCapture"]
