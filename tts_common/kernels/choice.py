"""Choosing the CPU linear kernels by measuring them (``--linear auto``).

At load, every candidate of the model's family (:mod:`.candidates`) is timed on every linear
shape of the model at every batch bucket the engine runs, over enough distinct random weights
that none stays in a cache (as in a decode step, which streams each weight once). The table is
logged and kept in a JSON file per CPU model and torch version under
:func:`~tts_common.kernels.cache.cache_dir`, so a restart does not measure again (only shapes,
buckets or thread counts not yet in the file are measured).

One kernel per shape, for every bucket: a request's codes must not depend on the batch it lands
in, and two kernels sum in different orders (for the same reason a kernel that is not itself
batch-invariant, torch's float32 ``F.linear``, is timed as the reference but never kept). The kernel kept for a shape is the one whose time,
relative to the fastest candidate at each bucket, summed over the buckets, is least (each bucket
counts the same: a kernel twice as slow at one bucket loses as much as it would at another),
except that one the fused layer stacks cannot run is kept only by a margin
(:data:`FUSABLE_MARGIN`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from tts_common.precision import QUANTIZATION_CHOICES

from .cache import load_json, machine_cache_file, store_json
from .candidates import (
    FAMILIES,
    FAMILY_DTYPE,
    NOT_BATCH_INVARIANT,
    QUANTIZED_FAMILIES,
    KernelLinear,
    candidate_available,
    family_kernels,
    fuse_outputs,
    kernel_revision,
    make_candidate,
    quantize_int8,
)
from .fused_stack import KINDS, fuse_stack

logger = logging.getLogger(__name__)

Shape = tuple[int, int, bool]
"""(in_features, out_features, has_bias) of a linear layer."""
STREAM_BYTES = 96 * 2**20
"""Weight bytes (in float32) timed per (shape, kernel): several times a server CPU's L3."""
MAX_COPIES = 48
REPEAT = 5


def shape_key(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}{'+b' if shape[2] else ''}"


def linear_shapes(module: nn.Module) -> Counter[Shape]:
    """How many ``nn.Linear`` layers of each shape ``module`` holds."""
    return Counter(
        (m.in_features, m.out_features, m.bias is not None) for m in module.modules() if type(m) is nn.Linear
    )


FUSABLE_MARGIN = 0.25
"""How much less slow (relative time summed over the buckets) a kernel the fused stacks cannot
run (torch's, oneDNN's) must be than the best one they can (:data:`.fused_stack.KINDS`) to be
kept for a shape: one such shape leaves every layer of its stack unfused. On a 2-core AMD EPYC
Zen 3 a timing of ours at 2 rows, 65% slow by noise, gave the 0.6B talker's down_proj to oneDNN
by 2%, and the float32 decode step took 472 ms at one row instead of 265."""


@dataclass
class KernelTable:
    """Measured seconds per call of each kernel, by shape and bucket, and the kernel kept per shape."""

    family: str
    buckets: tuple[int, ...]
    seconds: dict[Shape, dict[str, dict[int, float]]] = field(default_factory=dict)
    chosen: dict[Shape, str] = field(default_factory=dict)

    def choose(self) -> None:
        """Keep, per shape, the batch-invariant kernel least slow relative to the best of them
        at each bucket; one the fused stacks cannot run only where it is also
        :data:`FUSABLE_MARGIN` less slow than the best one they can."""
        for shape, measured in self.seconds.items():
            by_kernel = {k: t for k, t in measured.items() if k not in NOT_BATCH_INVARIANT}
            if not by_kernel:
                continue
            best = {b: min(times[b] for times in by_kernel.values()) for b in self.buckets}
            cost = {k: sum(times[b] / best[b] for b in self.buckets) for k, times in by_kernel.items()}
            kept = min(cost, key=cost.__getitem__)
            fusable = [k for k in cost if k in KINDS]
            if kept not in KINDS and fusable:
                ours = min(fusable, key=cost.__getitem__)
                if cost[kept] * (1 + FUSABLE_MARGIN) >= cost[ours]:
                    kept = ours
            self.chosen[shape] = kept

    def describe(self) -> str:
        """The table as log lines: per shape, each kernel's microseconds per bucket, * = kept."""
        head = f"linear kernels ({self.family}), microseconds per call at rows " + "/".join(
            map(str, self.buckets)
        )
        lines = [head]
        for shape in sorted(self.seconds):
            cells = []
            for kernel, times in self.seconds[shape].items():
                mark = "*" if self.chosen.get(shape) == kernel else ""
                cells.append(f"{mark}{kernel} " + "/".join(f"{1e6 * times[b]:.0f}" for b in self.buckets))
            lines.append(f"  {shape_key(shape)}: " + ", ".join(cells))
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """JSON-ready form (benchmarks' reports)."""
        return {
            "family": self.family,
            "buckets": list(self.buckets),
            "chosen": {shape_key(s): k for s, k in self.chosen.items()},
            "us_per_call": {
                shape_key(s): {k: {str(b): round(1e6 * t[b], 1) for b in self.buckets} for k, t in v.items()}
                for s, v in self.seconds.items()
            },
        }


def table_path() -> Path:
    """The cache file of this CPU model and torch version."""
    return machine_cache_file("linear-kernels")


def _run_all(layers: Sequence[KernelLinear], x: torch.Tensor) -> None:
    for layer in layers:
        layer(x)


def _copies(kernel: str, shape: Shape, gen: torch.Generator) -> list[KernelLinear] | None:
    """Distinct random layers of ``shape`` in kernel ``kernel``, enough to stream from memory."""
    fan_in, fan_out, bias = shape
    copies = max(2, min(MAX_COPIES, STREAM_BYTES // (4 * fan_in * fan_out)))
    layers: list[KernelLinear] = []
    for _ in range(copies):
        dense = nn.Linear(fan_in, fan_out, bias=bias, device="meta")
        dense.weight = nn.Parameter(torch.randn(fan_out, fan_in, generator=gen) * 0.02, requires_grad=False)
        if bias:
            dense.bias = nn.Parameter(torch.zeros(fan_out), requires_grad=False)
        layer = make_candidate(kernel, dense)
        if layer is None:
            return None
        layers.append(layer)
    return layers


def time_kernels(
    kernels: Sequence[str], shape: Shape, buckets: Sequence[int], repeat: int = REPEAT
) -> dict[str, dict[int, float]]:
    """Best seconds per call of each available kernel on ``shape`` at each bucket, over distinct
    random weights streamed from memory. The kernels take turns within each repeat, so a burst
    of load from other processes slows all of them alike rather than one."""
    gen = torch.Generator().manual_seed(0)
    layers = {k: c for k in kernels if (c := _copies(k, shape, gen)) is not None}
    best = {k: dict.fromkeys(buckets, float("inf")) for k in layers}
    with torch.inference_mode():
        inputs = {b: torch.randn(b, shape[0], generator=gen) for b in buckets}
        for copies in layers.values():  # warm-up: first touch of the weights, lazy set-up
            _run_all(copies, inputs[buckets[0]].to(copies[0].input_dtype))
        for _ in range(repeat):
            for b in buckets:
                for k, copies in layers.items():
                    x = inputs[b].to(copies[0].input_dtype)
                    t0 = time.perf_counter()
                    _run_all(copies, x)
                    best[k][b] = min(best[k][b], (time.perf_counter() - t0) / len(copies))
    return best


def measure_kernels(
    shapes: Iterable[Shape], family: str, buckets: Sequence[int], *, kernels: Sequence[str] | None = None
) -> KernelTable:
    """The kernel table of ``family`` for ``shapes`` at ``buckets``: from the cache file where
    it holds them (same threads), measured and added to it otherwise. ``kernels``: the
    candidates to time (default: the family's for its own model dtype, :func:`family_kernels`)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r} (choose from {', '.join(FAMILIES)})")
    # Only the kernels this machine runs: one it lacks (say gemv-bf16dp without AVX512-BF16) is
    # never timed, so never in the file, and would make every start measure its shapes again.
    kernels = tuple(
        k for k in (kernels or family_kernels(family, FAMILY_DTYPE[family])) if candidate_available(k)
    )
    buckets = tuple(sorted(set(buckets)))
    path = table_path()
    cache = load_json(path)
    threads = torch.get_num_threads()
    table = KernelTable(family, buckets)
    measured = 0
    for shape in sorted(set(shapes)):
        keys = {k: f"{k}{kernel_revision(k)}|{shape_key(shape)}|t{threads}" for k in kernels}
        if any(str(b) not in cache.get(key, {}) for key in keys.values() for b in buckets):
            # Measured again for every kernel of the shape together (they take turns).
            for kernel, times in time_kernels(kernels, shape, buckets).items():
                cache[keys[kernel]] = cache.get(keys[kernel], {}) | {str(b): t for b, t in times.items()}
            measured += 1
        for kernel, key in keys.items():
            if key in cache:
                table.seconds.setdefault(shape, {})[kernel] = {b: cache[key][str(b)] for b in buckets}
    if measured:
        store_json(path, cache)
    table.choose()
    source = f"measured {measured} shapes" if measured else "from the cache"
    logger.info("%s\n  (%s, %s)", table.describe(), source, path)
    return table


def use_kernels(module: nn.Module, table: KernelTable) -> Counter[str]:
    """Replace every ``nn.Linear`` of ``module`` by the kernel ``table`` keeps for its shape
    (int8 families quantize each weight once). Returns how many layers went to each kernel."""
    used: Counter[str] = Counter()
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            shape = (child.in_features, child.out_features, child.bias is not None)
            kernel = table.chosen.get(shape)
            if kernel is None:
                continue
            quantized = quantize_int8(child.weight) if table.family in QUANTIZED_FAMILIES else None
            layer = make_candidate(kernel, child, quantized)
            assert layer is not None  # measured, so available
            parent._modules[name] = layer
            used[kernel] += 1
    # Projections of one input (a module's FUSED_PROJECTIONS: q/k/v, gate/up) in one call of our
    # kernel where they got it: fewer calls per step, longer streams, the same bits per channel.
    for parent in list(module.modules()):
        for fused_name, part_names in getattr(parent, "FUSED_PROJECTIONS", {}).items():
            fused = fuse_outputs([parent._modules.get(n) for n in part_names])
            if fused is None:
                continue
            setattr(parent, fused_name, fused)
            for n in part_names:
                parent._modules[n] = None  # weights held once, by the fused call
            used[f"{fused.kernel} fused {'+'.join(part_names)}"] += 1
    # Whole decoder stacks (a module's FUSED_STACK: the attribute to fill) in one compiled call
    # per forward where all their linears got one of our packed GEMV kernels: the small ops
    # between the linears cost about as much as the linears at decode (.fused_stack).
    for stack in list(module.modules()):
        attribute = getattr(type(stack), "FUSED_STACK", None)
        if attribute is None:
            continue
        fused_stack = fuse_stack(stack)
        setattr(stack, attribute, fused_stack)
        if fused_stack is not None:
            used[f"fused stack {fused_stack.kernel} ({fused_stack.dims.layers} layers)"] += 1
    return used


__all__ = [
    "FAMILY_DTYPE",
    "KernelTable",
    "linear_shapes",
    "measure_kernels",
    "set_up_linears",
    "table_path",
    "use_kernels",
]


def _forced_kernel(linear: str, family: str) -> str:
    suffix = {"float32": "fp32", "bfloat16": "bf16", "int8": "int8", "w8a8": "w8a8"}[family]
    kernel = f"{linear}-{suffix}"
    if kernel not in FAMILIES[family]:
        raise ValueError(
            f"--linear {linear} has no {family} kernel (choose from auto, {', '.join(FAMILIES[family])})"
        )
    return kernel


def set_up_linears(
    module: nn.Module,
    device: torch.device | str,
    dtype: torch.dtype,
    linear: str,
    quantization: str,
    buckets: Sequence[int],
) -> tuple[str, KernelTable | None]:
    """Put the linear kernels of ``--linear``/``--quantization`` into ``module`` (a model about
    to decode at ``buckets`` rows); returns a one-line description and the measured table
    (``--linear auto``) or None. Raises ValueError for a combination that cannot run."""
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"unknown quantization {quantization!r} (choose from {', '.join(QUANTIZATION_CHOICES)})"
        )
    if torch.device(device).type != "cpu":
        if quantization != "none":
            raise ValueError(f"--quantization {quantization} runs on CPU only")
        return "torch (not on CPU)", None
    if quantization in QUANTIZED_FAMILIES:
        family = quantization
    elif dtype in (torch.float32, torch.bfloat16):
        family = "float32" if dtype == torch.float32 else "bfloat16"
    else:
        return f"torch ({dtype} has no other CPU kernels)", None
    if linear == "torch" and family not in QUANTIZED_FAMILIES:
        return "torch (nn.Linear)", None
    if family == "w8a8" and not candidate_available("gemv-w8a8"):
        logger.warning(
            "--quantization w8a8 without our kernel (AVX-512 VNNI or AVX2; this CPU or build lacks it) runs "
            "in torch's int8 GEMM, many times slower than --quantization int8 here"
        )
    shapes = linear_shapes(module)
    if linear == "auto":
        table = measure_kernels(shapes, family, buckets, kernels=family_kernels(family, dtype))
    else:
        table = KernelTable(family, tuple(buckets))
        kernel = _forced_kernel(linear, family)
        if make_candidate(kernel, nn.Linear(16, 16)) is None:
            raise ValueError(f"--linear {linear}: kernel {kernel} is not available on this machine")
        table.chosen = dict.fromkeys(shapes, kernel)
    used = use_kernels(module, table)
    described = ", ".join(f"{k} x{n}" for k, n in sorted(used.items()))
    return f"{family}: {described} (--linear {linear})", table if linear == "auto" else None
