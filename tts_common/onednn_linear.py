"""Pre-packed oneDNN kernels for the float32 ``nn.Linear`` layers of a model served on CPU.

Why: ``F.linear`` on CPU goes to MKL's sgemm, which on small row counts (one decode step = 1..16
rows) and on non-Intel CPUs reaches a fraction of the machine's peak. oneDNN with the weight
reordered once at load time into its blocked layout is about 2x faster at one row (the step is
memory-bound: fewer, better-prefetched weight reads) and about 2.8x faster at 16 rows (measured
on the 2-core AMD EPYC dev VM with a 1024x3072 layer and weights not in cache; the whole talker
step: ``bench/talker_bench.py --linear onednn`` vs ``--linear torch``).

Numerics: the products and sums are the same fp32 operations in a different summation order, so
results differ from MKL's in the last bits (relative ~1e-6), like any other GEMM library; the
fixture tests check that the official greedy outputs are still reproduced token for token.

Batch invariance: for two or more rows oneDNN computes every row with the same kernel and the
same summation order whatever the number of rows, but a single row takes a different (GEMV)
path. :class:`OneDnnLinear` therefore runs a lone row as two, so a row's result never depends on
which other rows share its batch — a request decoded alone gets the same bits as in any batch,
and a streamed chunk the same bits as the whole utterance.

Only CPU float32 modules are converted; CUDA and bfloat16 keep ``nn.Linear``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

ROW_HINT = 16
"""Row count the weight layout is tuned for (one decode step of a 16-slot engine). Any row
count works; results do not depend on the hint for >= 2 rows."""


@functools.cache
def onednn_ops_available(*names: str) -> bool:
    """True when this torch build has oneDNN and every ``torch.ops.mkldnn`` operator ``names``
    (the pre-packing ones are private and come and go between torch versions). Cached: the
    decoder's convolutions ask on every call."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return all(hasattr(ops, name) for name in names)


@functools.cache
def onednn_linear_available(dtype: torch.dtype = torch.float32) -> bool:
    """True when this torch build has oneDNN and the packed-linear operators, and they run
    ``dtype`` on this CPU. oneDNN's bfloat16 path refuses CPUs without AVX512-BW/VL/DQ or
    AVX-NE-CONVERT (an AVX2-only EPYC: "bf16 path needs the cpu support ..."), which no flag
    list here would track across torch versions, so it is asked once by packing and running a
    small layer."""
    if not onednn_ops_available("_reorder_linear_weight", "_linear_pointwise"):
        return False
    if dtype == torch.float32:
        return True
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), ROW_HINT)
        packed_linear(torch.zeros(2, 16, dtype=dtype), weight, None, 16, 16)
    except RuntimeError:
        return False
    return True


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int
) -> torch.Tensor:
    """``x @ W.T + bias`` with a weight packed by ``_reorder_linear_weight``; batch-invariant."""
    if x.numel() == in_features:
        # A single row: run it as two identical rows so it takes the multi-row kernel (see the
        # module docstring); the duplicate costs next to nothing at one row, where the layer is
        # bound by reading the weight.
        pair = x.reshape(1, in_features).expand(2, in_features)
        out = torch.ops.mkldnn._linear_pointwise(pair, weight, bias, "none", [], "")
        return out[:1].reshape(*x.shape[:-1], out_features)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDnnLinear(nn.Module):
    """Inference-only replacement of a CPU float32 ``nn.Linear`` with a pre-packed weight.

    The packed weight is registered as the buffer ``weight`` (and the bias as ``bias``) so the
    module's state-dict keys are those of the layer it replaces. It cannot be moved or cast:
    convert as the last step of loading.
    """

    def __init__(self, linear: nn.Linear, row_hint: int = ROW_HINT) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(weight, row_hint))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.in_features, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def use_onednn_linears(module: nn.Module, row_hint: int = ROW_HINT) -> int:
    """Replace every CPU float32 ``nn.Linear`` inside ``module`` by :class:`OneDnnLinear`.

    Returns how many layers were replaced (0 on CUDA, for other dtypes, or without oneDNN).
    """
    if not onednn_linear_available():
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if (
                type(child) is nn.Linear
                and child.weight.device.type == "cpu"
                and child.weight.dtype == torch.float32
            ):
                parent._modules[name] = OneDnnLinear(child, row_hint)
                replaced += 1
    return replaced
