"""The codec decoder's SnakeBeta activation, ``x + inv_beta * sin(x * alpha)^2`` per channel, in
one pass over the activations with the compiled library (:mod:`.snake_source`).

Why: on CPU torch runs it as five element-wise passes (seven for bf16 activations, widened to
float32 and rounded back), about a third of the decoder's CPU time on a 2-core EPYC (Zen 4):
``sin_`` alone 9%, the casts' copies 13% (bench/decoder_cpu.py, torch's profiler). Each value is
read and written once here, the sine evaluated in registers.

:func:`snake_beta` returns None where it does not apply (no library, not a CPU tensor, autograd
on, a layout other than channel- or time-major, another dtype); the caller then runs torch's
formula.
"""

from __future__ import annotations

import torch

from .gemv import library


def _unit_stride(t: torch.Tensor, dim: int) -> bool:
    return t.shape[dim] == 1 or t.stride(dim) == 1


def snake_beta(
    x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``x + inv_beta[c] * sin(x * alpha[c])^2`` for ``x`` [B, C, T] (float32 or bfloat16, each
    channel's T values contiguous or each time step's C), computed in float32 and rounded to
    ``x``'s dtype; ``alpha`` and ``inv_beta`` [C]. Written into ``out`` (same shape and dtype,
    contiguous along the same dimension, any other strides) when given, else into a new tensor
    of ``x``'s layout. None where the library cannot run it (see the module)."""
    if x.device.type != "cpu" or x.dim() != 3 or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or alpha.requires_grad or inv_beta.requires_grad):
        return None
    lib = library()
    if lib is None:
        return None
    batch, channels, frames = x.shape
    y = torch.empty_like(x) if out is None else out
    if y.shape != x.shape or y.dtype != x.dtype or y.device != x.device:
        return None
    if out is not None and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        return None  # in place: the pass past LIMIT re-reads x after the first wrote y
    # rows of contiguous values in both: channels (channel-major) or time steps (time-major);
    # rows and items at any stride (``out`` can be a window of a longer buffer)
    if _unit_stride(x, 2) and _unit_stride(y, 2):
        per_batch, n, per_column, row_dim = channels, frames, 0, 1
    elif _unit_stride(x, 1) and _unit_stride(y, 1):
        per_batch, n, per_column, row_dim = frames, channels, 1, 2
    else:
        return None
    alpha = alpha.detach().float().contiguous().reshape(channels)
    inv_beta = inv_beta.detach().float().contiguous().reshape(channels)
    if batch and per_batch and n:
        lib.snake_beta(
            x.data_ptr(),
            y.data_ptr(),
            alpha.data_ptr(),
            inv_beta.data_ptr(),
            batch,
            per_batch,
            n,
            x.stride(row_dim),
            x.stride(0),
            y.stride(row_dim),
            y.stride(0),
            int(x.dtype == torch.bfloat16),
            per_column,
            torch.get_num_threads(),
        )
    return y


__all__ = ["snake_beta"]
