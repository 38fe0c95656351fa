"""Our weight-streaming GEMV for CPU decode steps: int8 (per-output-channel scales) or bfloat16
weights, float32 activations, AVX-512, built for this machine on first use.

Why: at one to a few rows a decode step's linear is bound by reading its weight, and the library
kernels measured on the dev EPYC (torch fp32/bf16, oneDNN, ``torch._weight_int8pack_mm``) read
the talker's weights well below the machine's read bandwidth (see ``bench/gemv_bench.py``). This
kernel streams each weight row once for all rows of the batch and converts it in registers.

Build: the C source (:mod:`.gemv_source`) is compiled with the machine's C compiler
(``$CC`` or ``cc``, ``-O3 -march=native -fopenmp``) into a cache directory
(:func:`tts_common.kernels.cache.cache_dir`), keyed by the source, the compiler flags and the CPU
model and flags, so a restart loads it without compiling. It is loaded with :mod:`ctypes` (a plain C ABI:
no torch headers, a build of about a second). Where the compiler, OpenMP or AVX-512 is missing
:func:`gemv_available` is False and callers use the pure-torch path (:func:`gemv_reference`),
which computes the same sums in torch.

Numerics: each output is the float32 sum of ``x * w`` over the input features in a fixed order,
times the channel's scale, plus the bias: torch's float32 products of the same (exactly
representable) weights in another summation order, so it agrees with :func:`gemv_reference`
within float32 rounding, and a row's bits never depend on the other rows of its batch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from tts_common.cpu_info import cpu_flags, cpu_model

from .cache import cache_dir
from .gemv_source import SOURCE

logger = logging.getLogger(__name__)

CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
REQUIRED_FLAGS = frozenset({"avx512f", "avx512bw"})
"""CPU flags the kernel needs (``vpmovsxbd``/``vpmovzxwd`` on 512 bits)."""


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel, built once per machine (None where it cannot be built)."""
    if not REQUIRED_FLAGS <= cpu_flags():
        logger.info("GEMV kernel unavailable: the CPU lacks AVX-512 (%s)", ", ".join(sorted(REQUIRED_FLAGS)))
        return None
    cc = _compiler()
    if cc is None:
        logger.info("GEMV kernel unavailable: no C compiler ($CC, cc, gcc)")
        return None
    # -march=native compiles for this CPU's flags: hosts of one model name can differ in them (a
    # VM masking some, a generic name such as "AMD EPYC"), and a shared cache must not hand one a
    # build with instructions it lacks.
    key_parts = [SOURCE, *CFLAGS, cc, cpu_model(), *sorted(cpu_flags())]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    target = cache_dir() / f"gemv-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "gemv.c"
            src.write_text(SOURCE)
            out = Path(tmp) / "gemv.so"
            proc = subprocess.run([cc, *CFLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                logger.warning("GEMV kernel unavailable: %s failed: %s", cc, proc.stderr[-2000:])
                return None
            os.replace(out, target)  # atomic: a concurrent build sees the whole file or none
    lib = ctypes.CDLL(str(target))
    args = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    for name in ("gemv_i8", "gemv_bf16", "gemv_bf16dp"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = args
            fn.restype = None
    return lib


def bf16_dot_available() -> bool:
    """Whether the kernel was built with the bf16 dot-product instruction (AVX512-BF16), for
    bfloat16 activations (:func:`gemv` with a bfloat16 ``x``)."""
    lib = _library()
    return lib is not None and "avx512_bf16" in cpu_flags() and bool(lib.has_bf16dp())


def gemv_available() -> bool:
    """Whether the compiled kernel runs on this machine."""
    return _library() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def gemv(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T + bias`` in float32 with the compiled kernel.

    ``x`` float32 [R, K], ``weight`` int8 (``scale`` float32 [N] required) or bfloat16 [N, K],
    ``bias`` float32 [N] or None. Returns float32 [R, N]. A bfloat16 ``x`` with bfloat16 weights
    uses the bf16 dot-product instruction (:func:`bf16_dot_available`): exact products of the
    same bf16 values, float32 sums.
    """
    lib = _library()
    if lib is None:
        raise RuntimeError("the GEMV kernel is not available on this machine (see gemv_available)")
    rows, k = x.shape
    n = weight.shape[0]
    bf16_dot = x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
    if weight.shape[1] != k or not (x.dtype == torch.float32 or bf16_dot):
        raise ValueError(
            f"x {tuple(x.shape)} {x.dtype} does not fit weight {tuple(weight.shape)} {weight.dtype}"
        )
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=torch.float32)
    if bf16_dot:
        if not bf16_dot_available():
            raise RuntimeError("the GEMV kernel has no bf16 dot product on this machine")
        fn = lib.gemv_bf16dp
    elif weight.dtype == torch.int8:
        if scale is None:
            raise ValueError("int8 weights need their per-channel scales")
        fn = lib.gemv_i8
    elif weight.dtype == torch.bfloat16:
        fn = lib.gemv_bf16
    else:
        raise ValueError(f"unsupported weight dtype {weight.dtype}")
    fn(
        x.data_ptr(),
        weight.data_ptr(),
        _ptr(scale),
        _ptr(bias),
        y.data_ptr(),
        rows,
        k,
        n,
        torch.get_num_threads(),
    )
    return y


def gemv_reference(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The pure-torch path of :func:`gemv` (same arguments, float32 result)."""
    y = x.float() @ weight.float().T
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


__all__ = ["bf16_dot_available", "gemv", "gemv_available", "gemv_reference"]
