"""The CPU linear kernels a decode step can run, one ``nn.Module`` each, built from an
``nn.Linear``; the kernel choice (:mod:`.choice`) times them and keeps one per layer shape.

Families: the candidates of a family compute the same layer at the same precision, so choosing
among them changes only the summation order (last bits), never the model:

* ``float32``: ``torch-fp32`` (``F.linear``: MKL), ``onednn-fp32`` (pre-packed oneDNN) and
  ``gemv-fp32`` (ours, :mod:`.gemv`: the float32 weights packed, read once for all rows);
* ``bfloat16``: ``torch-bf16``, ``onednn-bf16``, ``gemv-bf16`` (ours, :mod:`.gemv`: float32
  FMAs), ``gemv-bf16dp`` (ours with the AVX512-BF16 dot product), ``gemvrow-bf16dp`` (the
  same instruction on the weight as given, row-wise: another summation order) and
  ``gemv-bf16amx`` (the dot product's packed weight on AMX-BF16 tiles: exact bf16 products,
  float32 sums, another order; 8 rows cost about what one does);
* ``int8`` (weight-only, per-output-channel scales: ``--quantization int8``), float32
  activations, or the bfloat16 model's bf16 activations widened exactly: ``torch-int8``
  (``torch._weight_int8pack_mm``), ``gemv-int8`` (ours), ``gemv-int8dp`` (ours with the
  AVX512-BF16 dot product, the weights widened to bf16 (exact), in a bfloat16 model only
  (:data:`BF16_ACTIVATIONS_ONLY`): exact products, float32 sums in another order; one widening
  serves 8 rows' dot products, so 8 rows ran 1.6x as fast as ``gemv-int8``'s FMAs on an
  AVX512-BF16 EPYC), ``gemv-int8amx`` (ours on AMX-BF16 tiles, the activations split exactly
  into three bf16: the same exact products, float32 sums in another order) and
  ``gemv-int8x4amx`` (ours on
  AMX-INT8 tiles: each row of activations as four int8 digits under a power-of-two scale, so
  its sums are exact integers and an activation is kept to 27 bits below its row's largest
  magnitude, :mod:`.amx_int8_source`; within float32 rounding of the others, closer to the
  exact sum than they are);
* ``w8a8`` (``--quantization w8a8``): the int8 weights and scales of ``int8``, and each row of
  activations quantized on the fly to int8 with its own step (symmetric, per token), summed
  exactly in int32: ``torch-w8a8`` (:func:`.gemv.w8a8_reference`) and ``gemv-w8a8`` (ours on
  AVX-512 VNNI or AVX2, :mod:`.w8a8_source`), the same bits. Lossier than ``int8`` (the activations
  keep 8 bits against their row's largest), but at 8 rows one instruction takes 64 products
  with no widening, where the weight-only kernels are bound by arithmetic.

A kept kernel must be batch-invariant: a row's result never depends on the other rows of its
batch (library kernels that take a separate path for a lone row run it as two rows, as
:class:`~tts_common.onednn_linear.OneDnnLinear` does). ``torch-fp32`` is not, even so (MKL's
sgemm splits its work by the row count: other bits at 1..5 rows than at 19 on the dev EPYC), so
it is timed for the table, as the reference, but never kept (:data:`NOT_BATCH_INVARIANT`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tts_common.onednn_linear import ROW_HINT, onednn_linear_available, packed_linear

from .gemv import (
    GROUP,
    LIBRARY_SOURCE,
    PackedWeight,
    amx_bf16_available,
    amx_int8_available,
    bf16_dot_available,
    gemv,
    gemv_available,
    gemv_w8a8,
    kernel_k_group,
    pack_w8a8,
    pack_weight,
    w8a8_kernel_available,
    w8a8_reference,
)

FAMILIES: dict[str, tuple[str, ...]] = {
    "float32": ("torch-fp32", "onednn-fp32", "gemv-fp32"),
    "bfloat16": ("torch-bf16", "onednn-bf16", "gemv-bf16", "gemv-bf16dp", "gemvrow-bf16dp", "gemv-bf16amx"),
    "int8": ("torch-int8", "gemv-int8", "gemv-int8dp", "gemv-int8amx", "gemv-int8x4amx"),
    "w8a8": ("torch-w8a8", "gemv-w8a8"),
}
"""Candidate kernels of each family, the library default first."""
QUANTIZED_FAMILIES = ("int8", "w8a8")
"""The families of int8 weights (:func:`quantize_int8`), each a ``--quantization`` value."""
BF16_ACTIVATIONS_ONLY = frozenset({"gemv-int8dp"})
"""int8 kernels that take bf16 activations: in a float32 model they would round them, so only a
bfloat16 model's choice (:func:`family_kernels`) offers them."""
NOT_BATCH_INVARIANT = frozenset({"torch-fp32"})
"""Kernels whose rows depend on their batch: measured, never chosen."""
CANDIDATES = tuple(name for names in FAMILIES.values() for name in names)
FAMILY_DTYPE = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int8": torch.float32,
    "w8a8": torch.float32,
}
"""The activation (model) dtype of each family."""


def family_kernels(family: str, model_dtype: torch.dtype) -> tuple[str, ...]:
    """The candidates of ``family`` for a model in ``model_dtype`` (the int8 family's bf16-only
    kernels in a bfloat16 model only)."""
    kernels = FAMILIES[family]
    if model_dtype != torch.bfloat16:
        kernels = tuple(k for k in kernels if k not in BF16_ACTIVATIONS_ONLY)
    return kernels


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of a [N, K] weight: ``(q, scale)`` with
    ``q = round(w / scale)`` in [-127, 127] and ``scale = max|w_row| / 127`` (float32; 1 for an
    all-zero row), so ``q * scale[:, None]`` approximates ``w`` within half a step per channel."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def _as_rows(x: torch.Tensor, fan_in: int) -> torch.Tensor:
    return x.reshape(-1, fan_in)


class KernelLinear(nn.Module):
    """Base of the candidates: ``forward(x [..., in]) -> [..., out]`` in :attr:`input_dtype`."""

    kernel = ""
    input_dtype = torch.float32

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features

    def weight_bytes(self) -> int:
        """Bytes of weights (and scales) one call reads."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def rows(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A kernel of another precision than the model's (int8 with float32 activations in a
        # bfloat16 model) converts at its edges.
        y = self.rows(_as_rows(x, self.in_features).to(self.input_dtype))
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


class TorchLinear(KernelLinear):
    """``F.linear`` in the family's dtype; a lone row runs as two (MKL's GEMV path for one row
    sums in another order than its GEMM)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__(linear)
        self.input_dtype = dtype
        self.kernel = "torch-fp32" if dtype == torch.float32 else "torch-bf16"
        self.register_buffer("weight", linear.weight.detach().to(dtype).contiguous())
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype).contiguous())

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return F.linear(x.expand(2, -1), self.weight, self.bias)[:1]
        return F.linear(x, self.weight, self.bias)


class TorchInt8Linear(KernelLinear):
    """``torch._weight_int8pack_mm`` (weight-only int8, float32 activations) plus the bias."""

    kernel = "torch-int8"

    def __init__(self, linear: nn.Linear, quantized: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        super().__init__(linear)
        q, scale = quantized if quantized is not None else quantize_int8(linear.weight)
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            y = torch._weight_int8pack_mm(x.expand(2, -1).contiguous(), self.weight, self.scale)[:1]
        else:
            y = torch._weight_int8pack_mm(x.contiguous(), self.weight, self.scale)
        return y if self.bias is None else y + self.bias


class TorchW8A8Linear(TorchInt8Linear):
    """int8 weights and per-row int8 activations in torch (:func:`.gemv.w8a8_reference`), with
    ``gemv-w8a8``'s bits: the ``w8a8`` family where our kernel is missing (an AVX-512 CPU without
    VNNI). Holds the int8 weights, scales and bias as :class:`TorchInt8Linear` does."""

    kernel = "torch-w8a8"

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return w8a8_reference(x, self.weight, self.scale, self.bias)


class GemvLinear(KernelLinear):
    """Our kernel (AVX-512 or AVX2) (:func:`.gemv.gemv`) on int8 (with scales), bfloat16 or
    float32 weights, packed once here (:func:`.gemv.pack_weight`; ``rows_layout``: kept as given,
    for the row-wise bf16 dot-product kernel); bf16 activations are widened to float32 and the
    result rounded back, as torch's bf16 GEMM does (the dot-product kernels take them as they
    are; ``amx``: on AMX-BF16 tiles; ``x_digits``: int8 on AMX-INT8 tiles; ``a8``: int8 weights
    and activations, :func:`.gemv.gemv_w8a8`)."""

    def __init__(
        self,
        linear: nn.Linear,
        weight_dtype: torch.dtype,
        quantized: tuple[torch.Tensor, torch.Tensor] | None = None,
        bf16_dot: bool = False,
        rows_layout: bool = False,
        amx: bool = False,
        x_digits: bool = False,
        a8: bool = False,
    ) -> None:
        super().__init__(linear)
        self.bf16_dot, self.rows_layout, self.amx, self.x_digits = bf16_dot, rows_layout, amx, x_digits
        self.a8 = a8
        if weight_dtype == torch.int8:
            self.kernel = (
                "gemv-w8a8"
                if a8
                else "gemv-int8x4amx"
                if x_digits
                else "gemv-int8amx"
                if amx
                else "gemv-int8dp"
                if bf16_dot
                else "gemv-int8"
            )
            self.input_dtype = torch.bfloat16 if bf16_dot else torch.float32
            q, scale = quantized if quantized is not None else quantize_int8(linear.weight)
        elif weight_dtype == torch.float32:
            self.kernel, self.input_dtype = "gemv-fp32", torch.float32
            q, scale = linear.weight.detach().float().contiguous(), None
        else:
            self.kernel = (
                "gemv-bf16"
                if not bf16_dot
                else "gemvrow-bf16dp"
                if rows_layout
                else "gemv-bf16amx"
                if amx
                else "gemv-bf16dp"
            )
            self.input_dtype = torch.bfloat16
            q, scale = linear.weight.detach().to(torch.bfloat16).contiguous(), None
        k_group = kernel_k_group(torch.bfloat16 if bf16_dot else torch.float32, q.dtype, amx, x_digits)
        self._packed = None if rows_layout else pack_w8a8(q) if a8 else pack_weight(q, k_group)
        self.register_buffer("weight", q if rows_layout else self._packed.data)
        self.register_buffer("scale", scale)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # .to()/.cpu() may replace the buffers: the packed view must follow the weight buffer.
        out = super()._apply(fn, recurse)
        if self._packed is not None:
            self._packed = dataclasses.replace(self._packed, data=self.weight)
        return out

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self._packed is None else self._packed
        if self.a8:
            assert isinstance(weight, PackedWeight) and self.scale is not None
            return gemv_w8a8(x.float(), weight, self.scale, self.bias)
        y = gemv(
            x if self.bf16_dot else x.float(),
            weight,
            self.scale,
            self.bias,
            rows_layout=self.rows_layout,
            amx=self.amx,
            x_digits=self.x_digits,
        )
        return y if self.input_dtype == torch.float32 else y.to(self.input_dtype)


def fuse_outputs(layers: Sequence[nn.Module | None]) -> GemvLinear | None:
    """One :class:`GemvLinear` computing ``layers`` (same input, outputs concatenated), or None
    where they cannot share a call: not all our packed kernel of one kind, or an output count
    that does not fill whole groups of 16. Each output channel is summed alone, so the fused
    call gives every channel the same bits as its own layer does."""
    first = layers[0]
    if not isinstance(first, GemvLinear) or first._packed is None:
        return None
    for layer in layers:
        if not (
            isinstance(layer, GemvLinear)
            and layer._packed is not None
            and layer.kernel == first.kernel
            and layer.in_features == first.in_features
            and layer.out_features % GROUP == 0
            and (layer.bias is None) == (first.bias is None)
            and (layer.scale is None) == (first.scale is None)
        ):
            return None
    parts: list[GemvLinear] = layers  # type: ignore[assignment]

    def cat(name: str) -> torch.Tensor | None:
        tensors = [getattr(layer, name) for layer in parts]
        return None if tensors[0] is None else torch.cat(tensors)

    fused = GemvLinear.__new__(GemvLinear)
    KernelLinear.__init__(fused, nn.Linear(first.in_features, 1, device="meta"))
    fused.out_features = sum(layer.out_features for layer in parts)
    fused.kernel, fused.input_dtype = first.kernel, first.input_dtype
    fused.bf16_dot, fused.rows_layout, fused.amx = first.bf16_dot, False, first.amx
    fused.x_digits, fused.a8 = first.x_digits, first.a8
    weight = cat("weight")
    assert weight is not None
    fused._packed = dataclasses.replace(first._packed, data=weight, out_features=fused.out_features)
    fused.register_buffer("weight", weight)
    fused.register_buffer("scale", cat("scale"))
    fused.register_buffer("bias", cat("bias"))
    return fused


class PackedLinear(KernelLinear):
    """Pre-packed oneDNN (:class:`~tts_common.onednn_linear.OneDnnLinear`) in the family's dtype."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__(linear)
        self.input_dtype = dtype
        self.kernel = "onednn-fp32" if dtype == torch.float32 else "onednn-bf16"
        weight = linear.weight.detach().to(dtype)
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, ROW_HINT))
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype).contiguous())

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.in_features, self.out_features)


def kernel_revision(name: str) -> str:
    """What identifies this version of kernel ``name`` in a cached timing (empty for library
    kernels, which the cache file's torch version identifies): ours changes with its source,
    and a timing of an earlier build must not choose for this one (the whole library's source:
    the fused stack shares it, and a rebuilt library is measured again)."""
    if name.startswith("gemv"):
        return "@" + hashlib.sha256(LIBRARY_SOURCE.encode()).hexdigest()[:10]
    return ""


def candidate_available(name: str) -> bool:
    """Whether kernel ``name`` runs on this machine and torch build."""
    if name.startswith("onednn"):
        return onednn_linear_available(torch.float32 if name == "onednn-fp32" else torch.bfloat16)
    if name in ("gemv-bf16dp", "gemvrow-bf16dp", "gemv-int8dp"):
        return bf16_dot_available()
    if name in ("gemv-bf16amx", "gemv-int8amx"):
        return amx_bf16_available()
    if name == "gemv-int8x4amx":
        return amx_int8_available()
    if name == "gemv-w8a8":
        return w8a8_kernel_available()
    if name.startswith("gemv"):
        return gemv_available()
    if name == "torch-int8":
        return hasattr(torch, "_weight_int8pack_mm")
    return name in CANDIDATES


def make_candidate(
    name: str, linear: nn.Linear, quantized: tuple[torch.Tensor, torch.Tensor] | None = None
) -> KernelLinear | None:
    """Kernel ``name`` computing ``linear`` (None where it is not available). ``quantized``: the
    layer's int8 weight and scales when already computed (int8 family)."""
    if not candidate_available(name):
        return None
    if name == "torch-fp32":
        return TorchLinear(linear, torch.float32)
    if name == "torch-bf16":
        return TorchLinear(linear, torch.bfloat16)
    if name == "onednn-fp32":
        return PackedLinear(linear, torch.float32)
    if name == "onednn-bf16":
        return PackedLinear(linear, torch.bfloat16)
    if name == "torch-int8":
        return TorchInt8Linear(linear, quantized)
    if name == "gemv-fp32":
        return GemvLinear(linear, torch.float32)
    if name == "gemv-int8":
        return GemvLinear(linear, torch.int8, quantized)
    if name == "gemv-int8dp":
        return GemvLinear(linear, torch.int8, quantized, bf16_dot=True)
    if name == "gemv-int8amx":
        return GemvLinear(linear, torch.int8, quantized, amx=True)
    if name == "gemv-int8x4amx":
        return GemvLinear(linear, torch.int8, quantized, x_digits=True)
    if name == "torch-w8a8":
        return TorchW8A8Linear(linear, quantized)
    if name == "gemv-w8a8":
        return GemvLinear(linear, torch.int8, quantized, a8=True)
    if name == "gemv-bf16":
        return GemvLinear(linear, torch.bfloat16)
    if name == "gemv-bf16dp":
        return GemvLinear(linear, torch.bfloat16, bf16_dot=True)
    if name == "gemvrow-bf16dp":
        return GemvLinear(linear, torch.bfloat16, bf16_dot=True, rows_layout=True)
    if name == "gemv-bf16amx":
        return GemvLinear(linear, torch.bfloat16, bf16_dot=True, amx=True)
    raise ValueError(f"unknown kernel {name!r} (choose from {', '.join(CANDIDATES)})")


__all__ = [
    "BF16_ACTIVATIONS_ONLY",
    "CANDIDATES",
    "FAMILIES",
    "FAMILY_DTYPE",
    "KernelLinear",
    "NOT_BATCH_INVARIANT",
    "QUANTIZED_FAMILIES",
    "candidate_available",
    "family_kernels",
    "fuse_outputs",
    "kernel_revision",
    "make_candidate",
    "quantize_int8",
]
