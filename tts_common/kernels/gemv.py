"""Our weight-streaming GEMV for CPU decode steps: int8 (per-output-channel scales), bfloat16 or
float32 weights, float32 activations, AVX-512 or AVX2 (:mod:`.vec_source`), built for this machine on first
use.

Why: at one to a few rows a decode step's linear is bound by reading its weight, and the library
kernels measured on the dev EPYC (torch fp32/bf16, oneDNN, ``torch._weight_int8pack_mm``) read
the talker's weights well below the machine's read bandwidth (see ``bench/gemv_bench.py``). This
kernel streams each weight once for all rows of the batch and converts it in registers; the
weights are pre-packed once (:func:`pack_weight`: groups of 16 output channels, k-major) so each
thread reads contiguous memory and no output needs a horizontal sum (see :mod:`.gemv_source`).

Build: the C source (:data:`LIBRARY_SOURCE`) is compiled with the machine's C compiler
(``$CC`` or ``cc``, ``-O3 -march=native -pthread``) into a cache directory
(:func:`tts_common.kernels.cache.cache_dir`), keyed by the source, the compiler flags and the CPU
model and flags, so a restart loads it without compiling. It is loaded with :mod:`ctypes` (a plain C ABI:
no torch headers, a build of about a second). Where the compiler, or both AVX-512 and AVX2, is missing
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from tts_common.cpu_info import cpu_flags, cpu_identity

from .amx_int8_source import SOURCE as AMX_INT8_SOURCE
from .amx_source import SOURCE as AMX_SOURCE
from .cache import cache_dir
from .gemv_source import SOURCE as GEMV_SOURCE
from .pool_source import SOURCE as POOL_SOURCE
from .snake_source import SOURCE as SNAKE_SOURCE
from .stack_source import SOURCE as STACK_SOURCE
from .vec_source import SOURCE as VEC_SOURCE
from .w8a8_source import SOURCE as W8A8_SOURCE

logger = logging.getLogger(__name__)

CFLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC", "-std=gnu11")
LIBRARY_SOURCE = (
    VEC_SOURCE
    + POOL_SOURCE
    + GEMV_SOURCE
    + AMX_SOURCE
    + AMX_INT8_SOURCE
    + W8A8_SOURCE
    + STACK_SOURCE
    + SNAKE_SOURCE
)
"""What the library compiles, in this order: the 16-lane vector on AVX-512 or AVX2
(:mod:`.vec_source`), the work sharing (:mod:`.pool_source`), the GEMV kernels (:mod:`.gemv_source`,
:mod:`.amx_source`, :mod:`.amx_int8_source`, :mod:`.w8a8_source`) and, calling them, the fused decoder stack
(:mod:`.stack_source`, :mod:`.fused_stack`), and the codec decoder's SnakeBeta activation
(:mod:`.snake_source`, :mod:`.snake`): one library, one worker pool per process."""
AVX512_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl"})
"""CPU flags of the library's AVX-512 build (``vpmovsxbd``/``vpmovzxwd`` on 512 bits; the fused
stack's masked 16-bit loads and stores of a bf16 cache on 256 bits)."""
AVX2_FLAGS = frozenset({"avx2", "fma"})
"""CPU flags of its AVX2 build (:mod:`.vec_source`: each 16-lane vector as two of 8), where the
AVX-512 ones are missing."""


def library_isa() -> str | None:
    """Which build of the library this CPU gets: "avx512", "avx2" or None (neither: the torch
    path)."""
    flags = cpu_flags()
    return "avx512" if AVX512_FLAGS <= flags else "avx2" if AVX2_FLAGS <= flags else None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def compile_library(source: str, out: Path, cc: str | None = None, march: str = "native") -> str | None:
    """Compile C ``source`` into the shared library ``out`` as the kernels are built (:data:`CFLAGS`
    with ``cc``, default ``$CC``, cc or gcc; the source is written beside ``out``; ``march``: for
    another CPU than this one, e.g. an AVX2 build to test on an AVX-512 machine): None, or why it
    failed."""
    cc = cc or _compiler()
    if cc is None:
        return "no C compiler ($CC, cc, gcc)"
    src = out.with_suffix(".c")
    src.write_text(source)
    flags = [f"-march={march}" if flag == "-march=native" else flag for flag in CFLAGS]
    proc = subprocess.run([cc, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"{cc} failed: {proc.stderr[-2000:]}"


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel, built once per machine (None where it cannot be built)."""
    if library_isa() is None:
        logger.info(
            "GEMV kernel unavailable: the CPU has neither AVX-512 (%s) nor AVX2 with FMA",
            ", ".join(sorted(AVX512_FLAGS)),
        )
        return None
    cc = _compiler()
    if cc is None:
        logger.info("GEMV kernel unavailable: no C compiler ($CC, cc, gcc)")
        return None
    # -march=native compiles for this CPU's flags: hosts of one model name can differ in them (a
    # VM masking some, a generic name such as "AMD EPYC"), and a shared cache must not hand one a
    # build with instructions it lacks (cpu_identity: the name, generation and flags).
    key_parts = [LIBRARY_SOURCE, *CFLAGS, cc, cpu_identity()]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    target = cache_dir() / f"gemv-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Built beside its target: os.replace is atomic (a concurrent build sees the whole
            # file or none) only within one filesystem, and a container's cache volume is not
            # /tmp's.
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / "gemv.so"
                error = compile_library(LIBRARY_SOURCE, out, cc)
                if error is not None:
                    logger.warning("GEMV kernel unavailable: %s", error)
                    return None
                os.replace(out, target)
        except OSError as e:  # a read-only or full cache: the torch path, not a failed start
            logger.warning("GEMV kernel unavailable: cannot build it into %s: %s", target.parent, e)
            return None
    lib = ctypes.CDLL(str(target))
    args = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    allocating = ("gemv_i8amx", "gemv_i8x4amx", "gemv_i8a8")  # these return -1 where out of memory
    names = (
        "gemv_f32",
        "gemv_i8",
        "gemv_bf16",
        "gemv_bf16dp",
        "gemv_bf16dp_rows",
        "gemv_i8dp",
        "gemv_bf16amx",
    )
    for name in (*names, *allocating):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = args
            fn.restype = ctypes.c_int if name in allocating else None
    lib.stack_workspace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.stack_workspace.restype = ctypes.c_long
    lib.stack_forward.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2
    lib.stack_forward.argtypes += [ctypes.c_int] * 2 + [ctypes.c_void_p, ctypes.c_int]
    lib.stack_forward.restype = ctypes.c_int
    lib.snake_beta.argtypes = (
        [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 + [ctypes.c_long] * 5 + [ctypes.c_int] * 3
    )
    lib.snake_beta.restype = ctypes.c_int
    return lib


def bf16_dot_available() -> bool:
    """Whether the kernel was built with the bf16 dot-product instruction (AVX512-BF16), for
    bfloat16 activations (:func:`gemv` with a bfloat16 ``x``, bfloat16 or int8 weights)."""
    lib = _library()
    return lib is not None and "avx512_bf16" in cpu_flags() and bool(lib.has_bf16dp())


def library() -> ctypes.CDLL | None:
    """The compiled library (GEMV and fused stack), or None where it cannot be built here."""
    return _library()


AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})
"""CPU flags of the AMX-BF16 kernel (``gemv_bf16amx``)."""


def amx_bf16_available() -> bool:
    """Whether the kernel has the AMX-BF16 tile kernels (:func:`gemv` with ``amx``): built with
    them (AMX-BF16 and AVX512-BF16), on a CPU that has them, and the OS granted this process the
    tile state (Linux >= 5.16; asked once, at the first call)."""
    lib = _library()
    return lib is not None and AMX_FLAGS | {"avx512_bf16"} <= cpu_flags() and bool(lib.has_amx_bf16())


def amx_int8_available() -> bool:
    """Whether the kernel has the AMX-INT8 tile kernel (:func:`gemv` with ``x_digits``): as
    :func:`amx_bf16_available`, and the CPU has AMX-INT8."""
    return amx_bf16_available() and "amx_int8" in cpu_flags() and bool(_library().has_amx_int8())  # type: ignore[union-attr]


def w8a8_kernel_available() -> bool:
    """Whether the library has the int8-activations kernel (:func:`gemv_w8a8`): built with
    AVX-512 VNNI (on a CPU that has it) or for AVX2; not an AVX-512 build without VNNI."""
    lib = _library()
    return (
        lib is not None and bool(lib.has_w8a8()) and (library_isa() == "avx2" or "avx512_vnni" in cpu_flags())
    )


def gemv_available() -> bool:
    """Whether the compiled kernel runs on this machine."""
    return _library() is not None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


GROUP = 16
"""Output channels per packed group (one lane each of a 16-lane vector)."""


X4_MAX_IN_FEATURES = 131072
"""Input features the AMX-INT8 kernel takes: its int32 sums of int8 products (each at most
127 * 127 in size) stay exact up to 2^31 / 127^2 = 133144 of them."""
A8_MAX_IN_FEATURES = 65536
"""Input features :func:`gemv_w8a8` takes: its int32 sums (on AVX-512 VNNI of weights offset
by 128, at most 255, times int8 activations, at most 127) stay exact up to 2^31 / (255 * 127) =
66311 of them."""
K_GROUP_PAD = {1: 1, 2: 2, 4: 64}
"""What the input features are zero-padded to a multiple of, by ``k_group``: pairs of k for the
bf16 dot product, whole 64-k tile blocks for the AMX-INT8 kernel."""


@dataclass(frozen=True)
class PackedWeight:
    """A [N, K] weight in the kernel's packed layout (:func:`pack_weight`)."""

    data: torch.Tensor
    """int8, bfloat16 or float32 ``[ceil(N/16), K' / k_group, 16, k_group]``: ``k_group`` consecutive k
    per output channel, K' the input features padded (:data:`K_GROUP_PAD`); channels and k past
    the weight's are zero."""
    out_features: int
    in_features: int
    k_group: int
    """1 (k-major: the FMA kernels), 2 (pairs of k: the bf16 dot product and AMX-BF16 kernels)
    or 4 (quads of k, K' a multiple of 64: the AMX-INT8 kernel)."""

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype


def pack_weight(weight: torch.Tensor, k_group: int = 1) -> PackedWeight:
    """``weight`` [N, K] (int8, bfloat16 or float32) in groups of 16 output channels, ``k_group``
    consecutive k per channel (:class:`PackedWeight`), zero-padded."""
    n, k = weight.shape
    n_pad = -(-n // GROUP) * GROUP
    k_pad = -(-k // K_GROUP_PAD[k_group]) * K_GROUP_PAD[k_group]
    padded = torch.zeros(n_pad, k_pad, dtype=weight.dtype)
    padded[:n, :k] = weight
    data = padded.view(n_pad // GROUP, GROUP, k_pad // k_group, k_group).permute(0, 2, 1, 3)
    return PackedWeight(data.contiguous(), n, k, k_group)


def kernel_k_group(x_dtype: torch.dtype, weight_dtype: torch.dtype, amx: bool, x_digits: bool) -> int:
    """The packed layout (:attr:`PackedWeight.k_group`) :func:`gemv` runs with these arguments."""
    if x_digits:
        return 4
    return 2 if amx or x_dtype == torch.bfloat16 else 1


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor | PackedWeight,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    rows_layout: bool = False,
    amx: bool = False,
    x_digits: bool = False,
) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T + bias`` in float32 with the compiled kernel.

    ``x`` float32 [R, K], ``weight`` int8 (``scale`` float32 [N] required), bfloat16 or float32 [N, K],
    packed (:func:`pack_weight` with :func:`kernel_k_group`; a plain tensor is packed for this
    call), ``bias`` float32 [N] or None. Returns float32 [R, N]. A bfloat16 ``x`` uses the bf16
    dot-product instruction (:func:`bf16_dot_available`) with bfloat16 weights, or with int8
    weights widened to bf16 (exact): exact products, float32 sums (for int8, another summation
    order than with float32 ``x``); ``rows_layout`` runs it on the plain [N, K] bf16 weight
    instead (the row-wise kernel, another summation order). ``amx`` runs bf16 or int8 weights
    on AMX-BF16 tiles (:func:`amx_bf16_available`; another summation order): with float32 ``x``
    each activation is split into three bf16 (exact), so the int8 products stay exact and are
    summed in float32 as without ``amx``. ``x_digits`` runs int8 weights on AMX-INT8 tiles
    (:func:`amx_int8_available`) with each row of ``x`` as four int8 digits under a power-of-two
    scale (:mod:`.amx_int8_source`): exact integer sums, ``x`` to 27 bits below its row's
    largest magnitude.
    """
    lib = _library()
    if lib is None:
        raise RuntimeError("the GEMV kernel is not available on this machine (see gemv_available)")
    k = x.shape[1]
    bf16_dot = x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
    int8_dot = x.dtype == torch.bfloat16 and weight.dtype == torch.int8 and not amx
    k_group = kernel_k_group(x.dtype, weight.dtype, amx, x_digits)
    if isinstance(weight, PackedWeight):
        n, fan_in = weight.out_features, weight.in_features
        if rows_layout or weight.k_group != k_group:
            raise ValueError("this packed weight does not fit the activations' dtype or layout")
    else:
        n, fan_in = weight.shape
    if fan_in != k or not (x.dtype == torch.float32 or bf16_dot or int8_dot):
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} does not fit weight [{n}, {fan_in}] {weight.dtype}")
    if weight.dtype == torch.int8 and scale is None:
        raise ValueError("int8 weights need their per-channel scales")
    if x_digits and (amx or rows_layout or x.dtype != torch.float32 or weight.dtype != torch.int8):
        raise ValueError("the AMX-INT8 kernel takes int8 weights and float32 activations only")
    if x_digits and k > X4_MAX_IN_FEATURES:
        raise ValueError(f"the AMX-INT8 kernel sums at most {X4_MAX_IN_FEATURES} input features (got {k})")
    if isinstance(weight, torch.Tensor) and not rows_layout:
        weight = pack_weight(weight, k_group)
    data = weight.data if isinstance(weight, PackedWeight) else weight.contiguous()
    if bf16_dot:
        if not bf16_dot_available():
            raise RuntimeError("the GEMV kernel has no bf16 dot product on this machine")
        if amx and (rows_layout or not amx_bf16_available()):
            raise RuntimeError("the GEMV kernel has no AMX-BF16 tiles for this layout on this machine")
        fn = lib.gemv_bf16dp_rows if rows_layout else lib.gemv_bf16amx if amx else lib.gemv_bf16dp
    elif int8_dot:
        if rows_layout:
            raise ValueError("the row-wise layout is the bf16 dot product's on bf16 weights only")
        if not bf16_dot_available():
            raise RuntimeError("the GEMV kernel has no bf16 dot product on this machine")
        fn = lib.gemv_i8dp
    elif amx and weight.dtype != torch.int8:
        raise ValueError("the AMX kernels take int8 weights or bfloat16 activations and weights")
    elif rows_layout:
        raise ValueError("the row-wise layout is the bf16 dot product's only")
    elif weight.dtype == torch.int8:
        if amx and not amx_bf16_available():
            raise RuntimeError("the GEMV kernel has no AMX-BF16 tiles on this machine")
        if x_digits and not amx_int8_available():
            raise RuntimeError("the GEMV kernel has no AMX-INT8 tiles on this machine")
        fn = lib.gemv_i8x4amx if x_digits else lib.gemv_i8amx if amx else lib.gemv_i8
    elif weight.dtype == torch.bfloat16:
        fn = lib.gemv_bf16
    elif weight.dtype == torch.float32:
        fn = lib.gemv_f32
    else:
        raise ValueError(f"unsupported weight dtype {weight.dtype}")
    return _call(fn, x, data, scale, bias, n)


def _call(
    fn: Callable[..., int | None],
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    n: int,
) -> torch.Tensor:
    """``y`` float32 [R, n] from library kernel ``fn`` (the kernels' one signature: x, w, scale,
    bias, y, R, K, N, threads) on torch's thread count."""
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty(rows, n, dtype=torch.float32)
    status = fn(
        x.data_ptr(),
        data.data_ptr(),
        _ptr(scale),
        _ptr(bias),
        y.data_ptr(),
        rows,
        k,
        n,
        torch.get_num_threads(),
    )
    if status:  # only the kernels that allocate return one
        raise MemoryError(
            f"the GEMV kernel {getattr(fn, '__name__', fn)} could not allocate its converted activations"
        )
    return y


def pack_w8a8(q: torch.Tensor) -> PackedWeight:
    """An int8 [N, K] weight (:func:`.candidates.quantize_int8`) in :func:`gemv_w8a8`'s layout:
    quads of k (``k_group=4``), each byte offset by 128 (``w + 128`` as an unsigned byte, stored
    in the int8 tensor; padding too, where the activations are zero)."""
    packed = pack_weight(q, k_group=4)
    return replace(packed, data=(packed.data.view(torch.uint8) ^ 0x80).view(torch.int8))


def gemv_w8a8(
    x: torch.Tensor, weight: PackedWeight, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x`` float32 [R, K] quantized per row to int8, times the int8 ``weight`` (:func:`pack_w8a8`)
    with per-channel ``scale`` (float32 [N]), plus ``bias`` (float32 [N] or None), on AVX-512 VNNI
    or AVX2 (:func:`w8a8_kernel_available`; :mod:`.w8a8_source`). Returns float32 [R, N], the bits of
    :func:`w8a8_reference`."""
    lib = _library()
    if lib is None or not w8a8_kernel_available():
        raise RuntimeError("the GEMV library has no w8a8 kernel on this machine (see w8a8_kernel_available)")
    k = x.shape[1]
    if (
        x.dtype != torch.float32
        or weight.dtype != torch.int8
        or weight.k_group != 4
        or k != weight.in_features
    ):
        raise ValueError(
            f"x {tuple(x.shape)} {x.dtype} does not fit the packed w8a8 weight [{weight.out_features}, {weight.in_features}]"
        )
    if k > A8_MAX_IN_FEATURES:
        raise ValueError(f"the w8a8 kernel sums at most {A8_MAX_IN_FEATURES} input features (got {k})")
    return _call(lib.gemv_i8a8, x, weight.data, scale, bias, weight.out_features)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of float32 ``x`` [R, K] as int8: ``(q, step)`` with ``step = max|x_row| / 127``
    and ``q = round_half_even(x / step)`` in [-127, 127] (float32 arithmetic, as the kernel).
    A row whose step is zero quantizes to zeros; a row with a non-finite value gets a NaN step."""
    step = x.abs().amax(dim=1) / 127.0
    finite = torch.isfinite(x).all(dim=1)
    usable = finite & (step > 0)
    safe = torch.where(usable, step, torch.ones_like(step))
    q = torch.where(usable[:, None], torch.round(x / safe[:, None]).clamp(-127, 127), torch.zeros_like(x))
    step = torch.where(usable, step, torch.zeros_like(step))
    return q.to(torch.int8), torch.where(finite, step, torch.full_like(step, float("nan")))


def w8a8_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`gemv_w8a8` in torch (the same bits): ``x`` float32 [R, K], ``q`` int8 [N, K] and
    its ``scale`` float32 [N] (:func:`.candidates.quantize_int8`). The integer sums are exact
    (``torch._int_mm``: int32, as the kernel's), then rounded once to float32 as the kernel's
    conversion does. Slow (torch's int8 GEMM on CPU reads ~0.5 GB/s of weights): the family's
    fallback where our kernel is missing, and the tests' reference."""
    xq, step = quantize_rows(x.float())
    if xq.shape[1] == 1:  # torch 2.13's CPU _int_mm sums wrongly over one input feature: pad a zero
        xq, q = F.pad(xq, (0, 1)), F.pad(q, (0, 1))
    sums = torch._int_mm(xq, q.T).float()
    y = sums * (step[:, None] * scale[None, :])
    return y if bias is None else y + bias


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


__all__ = [
    "A8_MAX_IN_FEATURES",
    "LIBRARY_SOURCE",
    "X4_MAX_IN_FEATURES",
    "PackedWeight",
    "amx_bf16_available",
    "amx_int8_available",
    "bf16_dot_available",
    "compile_library",
    "gemv",
    "gemv_available",
    "gemv_reference",
    "gemv_w8a8",
    "kernel_k_group",
    "library",
    "library_isa",
    "pack_w8a8",
    "pack_weight",
    "quantize_rows",
    "w8a8_kernel_available",
    "w8a8_reference",
]
