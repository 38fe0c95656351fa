"""One compiled call for a whole decoder-stack forward (all layers and the final norm) on CPU,
where every linear of the stack is one of our packed GEMV kernels: ``gemv-fp32`` (float32),
``gemv-int8``, ``gemv-int8amx`` or ``gemv-int8x4amx`` (``--quantization int8``), ``gemv-w8a8``
(``--quantization w8a8``), ``gemv-bf16``,
``gemv-bf16dp`` or ``gemv-bf16amx`` (bfloat16).

Why: at decode a released 0.6B frame is 28 talker layers once and 5 code-predictor layers 15
times; with the linears at their memory-bandwidth floor, the ~7000 small torch ops, Python and
ctypes calls between them (norms, RoPE, K/V writes, SDPA, SiLU, residual adds) took about as long
as the linears themselves. The C side (:mod:`.stack_source`) runs them between the GEMV calls
of the same library, on the same worker pool.

Scope (the caller decides per call, :meth:`FusedStack.accepts`): tokens that each attend keys
``[0, own position]`` of their row's cache slot, exactly (the talker's masked decode, the code
predictor's causal prefill of positions 0..S-1 and its one-token steps); activations and a
contiguous KV cache ``[layers, slots, kv_heads, max_len, head_dim]`` in the model's dtype
(float32 or bfloat16). A stack whose linears are anything else (torch, oneDNN, the row-wise
bf16 kernel, a machine without the compiled library) gets no fused forward (:func:`fuse_stack`
returns None) and keeps the torch path, bit for bit.

Numerics against the torch path with the same GEMV kernels: every operation is the same
operation, rounded to bfloat16 exactly where the torch path stores a bfloat16 tensor (RMSNorm's
normalized value and its product with the weight, each linear's output, the RoPE products and
their sum, the attention output, the residual sums, SiLU and its product with ``up``; the K/V
written). Where they differ: sums run in another order (RMSNorm's mean of squares, q.k dots, the
softmax sum and value sums: 16 lanes then one reduction; the attention is an online softmax over
blocks of 64 keys, where torch's CPU flash attention takes larger blocks), ``exp`` is a
polynomial of about 1 ulp (softmax, SiLU) instead of torch's, and in bfloat16 the softmax
probabilities are rounded to bf16 before they weight the values (what torch's CPU flash kernel
does for reduced precision; its exact blocking is not reproduced). float32: last-bit differences
per operation (the tests bound them at relative 1e-5); bfloat16: a value near a rounding
boundary can land one bf16 step (2^-8 relative) apart, and that propagates (the tests bound it
loosely). The cos/sin rows are the caller's (the torch path's
own tables), and a token's bits never depend on the other rows of its call (each is computed
from its own row alone).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .candidates import GemvLinear
from .gemv import library

PARAMS_PER_LAYER = 22
"""Pointers per layer, in the C enum's order (``P_IN_NORM`` .. ``P_UP_SCALE``)."""
KINDS_PER_LAYER = 7
"""Kernels per layer, in the C order: q/k/v (or q), o, gate/up (or gate), down, k, v, up."""


class _StackDesc(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_int),
        ("hidden", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("inter", ctypes.c_int),
        ("bf16", ctypes.c_int),
        ("kinds", ctypes.POINTER(ctypes.c_int)),
        ("eps", ctypes.c_float),
        ("scaling", ctypes.c_float),
        ("params", ctypes.POINTER(ctypes.c_void_p)),
        ("final_norm", ctypes.c_void_p),
    ]


_ERRORS = {
    1: "a position lies outside the cache",
    2: "a slot lies outside the cache",
    3: "the head dimension is over 1024, or the heads are not a multiple of the kv heads (at most 64 each)",
    4: "the bf16 dot-product or AMX kernel is not in this build",
}
KINDS = {
    "gemv-int8": 0,
    "gemv-bf16": 1,
    "gemv-bf16dp": 2,
    "gemv-int8amx": 3,
    "gemv-bf16amx": 4,
    "gemv-int8x4amx": 5,
    "gemv-int8dp": 6,
    "gemv-fp32": 7,
    "gemv-w8a8": 8,
}
"""The packed GEMV kernels a fused stack runs (the C side's ``K_*``)."""
FLOAT32_INPUT_KINDS = frozenset({"gemv-fp32", "gemv-int8", "gemv-int8amx", "gemv-int8x4amx", "gemv-w8a8"})
"""Those with float32 activations (float32 weights, or int8): the only ones a float32 stack can run."""


@dataclass(frozen=True)
class StackDims:
    """The dimensions of a decoder stack."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


class FusedStack:
    """The fused forward of one decoder stack (built by :func:`fuse_stack`; held by the stack,
    called by it for the token layouts it may take). Holds the tensors whose addresses it
    passes, so the stack must not move or re-cast its weights after set-up (set-up runs last,
    on the model as it will run)."""

    def __init__(
        self,
        dims: StackDims,
        dtype: torch.dtype,
        kernels: list[str],
        eps: float,
        scaling: float,
        tensors: list[torch.Tensor | None],
        final_norm: torch.Tensor,
    ) -> None:
        lib = library()
        assert lib is not None and len(tensors) == dims.layers * PARAMS_PER_LAYER
        assert len(kernels) == dims.layers * KINDS_PER_LAYER
        self._lib = lib
        self.dims = dims
        self.dtype = dtype
        """The activations' and the KV cache's dtype."""
        self.kernel = "+".join(sorted(set(kernels)))
        """The GEMV kernels of its linears (one, or several joined by ``+``)."""
        self._kinds = (ctypes.c_int * len(kernels))(*(KINDS[k] for k in kernels))
        self._tensors = [t for t in tensors if t is not None] + [final_norm]  # kept alive
        self._params = (ctypes.c_void_p * len(tensors))(
            *(None if t is None else t.data_ptr() for t in tensors)
        )
        self._desc = _StackDesc(
            dims.layers,
            dims.hidden,
            dims.heads,
            dims.kv_heads,
            dims.head_dim,
            dims.intermediate,
            int(dtype == torch.bfloat16),
            ctypes.cast(self._kinds, ctypes.POINTER(ctypes.c_int)),
            eps,
            scaling,
            ctypes.cast(self._params, ctypes.POINTER(ctypes.c_void_p)),
            final_norm.data_ptr(),
        )

    def accepts(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        """Whether :meth:`forward` runs these activations and caches (the stack's dtype, on
        CPU, the cache contiguous and shaped for this stack)."""
        d = self.dims
        shape = (d.layers, k_cache.shape[1] if k_cache.dim() == 5 else -1, d.kv_heads)
        return (
            x.dtype == self.dtype
            and x.device.type == "cpu"
            and x.dim() == 3
            and x.shape[-1] == d.hidden
            and all(
                c.dtype == self.dtype
                and c.device.type == "cpu"
                and c.dim() == 5
                and tuple(c.shape[:3]) == shape
                and c.shape[4] == d.head_dim
                and c.is_contiguous()
                for c in (k_cache, v_cache)
            )
            and k_cache.shape == v_cache.shape
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        positions: torch.Tensor,
        slots: int | torch.Tensor | None,
    ) -> torch.Tensor:
        """The stack's final-norm hidden states [B, S, H] of ``x`` [B, S, H]: token (b, s) at
        cache position ``positions[b, s]`` of slot ``slots`` (int: slot ``slots + b``; None:
        slot b; tensor [B]: ``slots[b]``), attending keys ``[0, positions[b, s]]`` of its slot;
        its K/V are written there. ``cos``/``sin`` [B, S, head_dim]: the RoPE tables of
        ``positions`` (in the activations' dtype, as the torch path uses them). Raises
        ValueError for a position or slot outside the cache."""
        b, s, hidden = x.shape
        if isinstance(slots, torch.Tensor):
            slot_rows = slots.to(torch.int64).contiguous()
        else:
            slot_rows = torch.arange(b, dtype=torch.int64) + (0 if slots is None else slots)
        if slot_rows.shape != (b,) or positions.shape != (b, s):
            raise ValueError(
                f"slots {tuple(slot_rows.shape)} / positions {tuple(positions.shape)} do not fit x"
            )
        dtype = x.dtype
        x = x.float().contiguous()
        positions = positions.to(torch.int64).contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        out = torch.empty(b, s, hidden, dtype=torch.float32)
        work = torch.empty(self._lib.stack_workspace(ctypes.byref(self._desc), b * s), dtype=torch.float32)
        rc = self._lib.stack_forward(
            ctypes.byref(self._desc),
            x.data_ptr(),
            out.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            slot_rows.data_ptr(),
            b,
            s,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.shape[1],
            k_cache.shape[3],
            work.data_ptr(),
            torch.get_num_threads(),
        )
        if rc == 5:
            raise MemoryError("fused stack: an int8 kernel could not allocate its converted activations")
        if rc:
            raise ValueError(f"fused stack: {_ERRORS.get(rc, f'error {rc}')}")
        return out.to(dtype)  # exact: bf16 activations are rounded in C


def _packed_gemv(layer: nn.Module | None, fan_in: int, fan_out: int) -> GemvLinear | None:
    if (
        isinstance(layer, GemvLinear)
        and layer.kernel in KINDS
        and layer._packed is not None
        and layer.in_features == fan_in
        and layer.out_features == fan_out
    ):
        return layer
    return None


def _norm_weight(norm: nn.Module, dim: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The norm's weight as float32 (exact for a bfloat16 one), or None where it does not fit."""
    w = getattr(norm, "weight", None)
    if isinstance(w, torch.Tensor) and w.dtype == dtype and w.shape == (dim,) and w.device.type == "cpu":
        return w.detach().float().contiguous()
    return None


def fuse_stack(stack: nn.Module) -> FusedStack | None:
    """The fused forward of ``stack`` (a decoder stack with the checkpoint's names: ``layers``
    of ``input_layernorm``, ``self_attn`` (``qkv_proj`` or ``q/k/v_proj``, ``o_proj``,
    ``q_norm``, ``k_norm``), ``post_attention_layernorm``, ``mlp`` (``gate_up_proj`` or
    ``gate/up_proj``, ``down_proj``, SiLU); ``norm``), or None where it cannot run it: the library missing here, a linear that
    is not one of our packed GEMV kernels (each may run another of them: the choice is per
    shape), bf16 weights in a float32 model, norms of another dtype than the model's or of
    different epsilons. The activations' dtype is the norms' (the model's): float32 or
    bfloat16."""
    layers = getattr(stack, "layers", None)
    if not layers:
        return None
    first = layers[0].self_attn
    dtype = layers[0].input_layernorm.weight.dtype
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    hidden = layers[0].input_layernorm.weight.shape[0]
    heads, kv_heads, head_dim = first.heads, first.kv_heads, first.head_dim
    if head_dim > 1024 or head_dim % 2 or heads % kv_heads or heads // kv_heads > 64:
        return None  # beyond the C side's fixed buffers (released models: 128, 2 heads per kv head)
    down_proj = getattr(layers[0].mlp, "down_proj", None)
    if not isinstance(down_proj, GemvLinear):
        return None  # before the library: a stack of other kernels never builds it
    lib = library()
    if lib is None or not hasattr(lib, "stack_forward"):
        return None
    inter = down_proj.in_features
    eps = stack.norm.eps
    tensors: list[torch.Tensor | None] = []
    kernels: list[str] = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (attn.heads, attn.kv_heads, attn.head_dim) != (heads, kv_heads, head_dim) or mlp.act is not F.silu:
            return None
        # q/k/v and gate/up: one fused call, or (where the choice kept different kernels for
        # their shapes, so use_kernels could not fuse them) one call per part.
        if attn.qkv_proj is not None:
            qkv_parts = [_packed_gemv(attn.qkv_proj, hidden, (heads + 2 * kv_heads) * head_dim)]
        else:
            qkv_parts = [
                _packed_gemv(attn.q_proj, hidden, heads * head_dim),
                _packed_gemv(attn.k_proj, hidden, kv_heads * head_dim),
                _packed_gemv(attn.v_proj, hidden, kv_heads * head_dim),
            ]
        if mlp.gate_up_proj is not None:
            gate_up_parts = [_packed_gemv(mlp.gate_up_proj, hidden, 2 * inter)]
        else:
            gate_up_parts = [
                _packed_gemv(mlp.gate_proj, hidden, inter),
                _packed_gemv(mlp.up_proj, hidden, inter),
            ]
        o = _packed_gemv(attn.o_proj, heads * head_dim, hidden)
        down = _packed_gemv(mlp.down_proj, inter, hidden)
        norms = [
            (layer.input_layernorm, hidden),
            (attn.q_norm, head_dim),
            (attn.k_norm, head_dim),
            (layer.post_attention_layernorm, hidden),
        ]
        weights = [_norm_weight(n, dim, dtype) for n, dim in norms]
        linears = [*qkv_parts, o, *gate_up_parts, down]
        if any(lin is None for lin in linears) or any(w is None for w in weights):
            return None
        if any(n.eps != eps for n, _ in norms) or any(g.bias is not None for g in [*gate_up_parts, down]):  # type: ignore[union-attr]
            return None
        # Each linear keeps the kernel the choice kept for its shape; all but FLOAT32_INPUT_KINDS
        # (bf16 weights, or int8 widened to bf16) take bf16 activations only.
        if any(lin.kernel not in FLOAT32_INPUT_KINDS and dtype != torch.bfloat16 for lin in linears):  # type: ignore[union-attr]
            return None
        q, k, v = (qkv_parts * 3)[:3] if len(qkv_parts) == 1 else qkv_parts
        gate, up = (gate_up_parts * 2)[:2] if len(gate_up_parts) == 1 else gate_up_parts
        split_qkv, split_gate_up = len(qkv_parts) == 3, len(gate_up_parts) == 2
        in_norm, q_norm, k_norm, post_norm = weights
        tensors += [in_norm, q.weight, q.scale, q.bias, q_norm, k_norm, o.weight, o.scale, o.bias]  # type: ignore[union-attr]
        tensors += [post_norm, gate.weight, gate.scale, down.weight, down.scale]  # type: ignore[union-attr]
        tensors += [k.weight, k.scale, k.bias, v.weight, v.scale, v.bias] if split_qkv else [None] * 6  # type: ignore[union-attr]
        tensors += [up.weight, up.scale] if split_gate_up else [None] * 2  # type: ignore[union-attr]
        # C order: q/k/v (or q), o, gate/up (or gate), down, k, v, up (unused parts: any kernel).
        kernels += [lin.kernel for lin in (q, o, gate, down, k, v, up)]  # type: ignore[union-attr]
    final = _norm_weight(stack.norm, hidden, dtype)
    if final is None:
        return None
    dims = StackDims(len(layers), hidden, heads, kv_heads, head_dim, inter)
    return FusedStack(dims, dtype, kernels, eps, float(first.scaling), tensors, final)


__all__ = ["KINDS", "FusedStack", "StackDims", "fuse_stack"]
