"""Side by side in one process: GB/s of weights that versions of the kernel library's GEMV read,
on the same weights, in alternating sweeps (so a shared host's noise falls on every version
alike, unlike separate runs of ``bench/gemv_bench.py``).

A version is the library's whole C source (:data:`tts_common.kernels.gemv.LIBRARY_SOURCE`):
``now`` is this tree's; ``NAME=PATH`` a file written by ``--dump`` from another checkout (or
edited by hand). A sweep runs one decode step's worth of the talker's fused calls at the
released 0.6B dimensions (q/k/v 1024->4096, o 2048->1024, gate/up 1024->6144, down 3072->1024)
over ``--layers`` distinct layers (13: 195 MiB of int8, far past the caches; 1: 15 MiB, in a
32 MiB L3), next to torch's float32 sum over as many bytes (the read the floor is set against).
Each version has its own worker pool; the idle one sleeps within a few hundred microseconds.

    git stash && python bench/kernel_ab.py --dump /tmp/before.c && git stash pop
    python bench/kernel_ab.py before=/tmp/before.c now --kernel int8 --rows 1 --rounds 15
    python bench/kernel_ab.py now --kernel bf16 --rows 8 --rounds 5   # one version: its GB/s
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tts_common.cpu_info import cpu_identity
from tts_common.kernels.candidates import quantize_int8
from tts_common.kernels.gemv import LIBRARY_SOURCE, compile_library, pack_weight

SHAPES = ((1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024))
"""(in, out) of one talker layer's calls with q/k/v and gate/up fused."""
KERNELS = {
    "fp32": "gemv_f32",
    "int8": "gemv_i8",
    "bf16": "gemv_bf16",
    "bf16dp": "gemv_bf16dp",
    "int8dp": "gemv_i8dp",
}
"""``--kernel``: float32, int8 or bf16 weights with float32 activations (FMAs), or bf16 activations with
bf16 or int8 weights (the dot product)."""


def build(source: str, work: Path) -> ctypes.CDLL:
    """The library compiled from ``source`` as the package compiles it."""
    lib = work / f"{hashlib.sha256(source.encode()).hexdigest()[:12]}.so"
    error = compile_library(source, lib)
    if error is not None:
        raise SystemExit(f"cannot build a version: {error}")
    return ctypes.CDLL(str(lib))


def make_layers(
    kernel: str, layers: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None, int, int]], int]:
    """Packed weights (and int8 scales) of ``layers`` layers of :data:`SHAPES`, and their bytes."""
    g = torch.Generator().manual_seed(0)
    out: list[tuple[torch.Tensor, torch.Tensor | None, int, int]] = []
    for _ in range(layers):
        for k, n in SHAPES:
            w = torch.randn(n, k, generator=g)
            if kernel in ("int8", "int8dp"):
                q, scale = quantize_int8(w)
                out.append((pack_weight(q, 2 if kernel == "int8dp" else 1).data, scale, k, n))
            elif kernel == "fp32":
                out.append((pack_weight(w).data, None, k, n))
            else:
                out.append(
                    (pack_weight(w.to(torch.bfloat16), 2 if kernel == "bf16dp" else 1).data, None, k, n)
                )
    return out, sum(w.numel() * w.element_size() for w, _, _, _ in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="*", help="now, or NAME=PATH of a library source")
    ap.add_argument("--dump", type=Path, help="write this tree's library source here and exit")
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="int8")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=13)
    opts = ap.parse_args()
    if opts.dump:
        opts.dump.write_text(LIBRARY_SOURCE)
        return
    if not opts.versions:
        ap.error("name at least one version (now, NAME=PATH)")
    threads = torch.get_num_threads()
    layers, nbytes = make_layers(opts.kernel, opts.layers)
    act = torch.bfloat16 if opts.kernel in ("bf16dp", "int8dp") else torch.float32
    xs = {k: torch.randn(opts.rows, k).to(act) for k, _ in SHAPES}
    ys = {n: torch.empty(opts.rows, n) for _, n in SHAPES}
    with tempfile.TemporaryDirectory() as tmp:
        fns = {}
        for version in opts.versions:
            name, _, path = version.partition("=")
            lib = build(LIBRARY_SOURCE if version == "now" else Path(path).read_text(), Path(tmp))
            fn = getattr(lib, KERNELS[opts.kernel])
            fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
            fn.restype = None
            fns[name] = fn

        def sweep(fn: ctypes._CFuncPtr) -> float:  # type: ignore[name-defined]
            start = time.perf_counter()
            for w, scale, k, n in layers:
                fn(
                    xs[k].data_ptr(),
                    w.data_ptr(),
                    None if scale is None else scale.data_ptr(),
                    None,
                    ys[n].data_ptr(),
                    opts.rows,
                    k,
                    n,
                    threads,
                )
            return time.perf_counter() - start

        for fn in fns.values():  # page faults, the pools' start
            sweep(fn)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(opts.rounds):
            for name, fn in fns.items():
                times[name].append(sweep(fn))
    flat = torch.ones(nbytes // 4)
    read = []
    for _ in range(opts.rounds):
        start = time.perf_counter()
        flat.sum()
        read.append(time.perf_counter() - start)
    print(f"{cpu_identity()}, {threads} threads, {opts.kernel} at {opts.rows} rows, {nbytes / 2**20:.0f} MiB")
    print(f"  torch float32 sum: median {nbytes / statistics.median(read) / 1e9:.1f} GB/s")
    for name, ts in times.items():
        print(
            f"  {name}: median {nbytes / statistics.median(ts) / 1e9:.1f} GB/s, best {nbytes / min(ts) / 1e9:.1f}"
        )


if __name__ == "__main__":
    main()
