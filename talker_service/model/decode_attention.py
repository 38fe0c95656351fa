"""Decode attention that reads the talker's KV cache in place, with per-row key lengths.

Used by the graph-path decode step (:mod:`talker_service.engine.cuda_graphs`): running requests
sit in slots 0..n-1 (the scheduler keeps them compact), so a step over B rows reads the views
``k[:, :B]`` / ``v[:, :B]`` of the whole slot length (no copy), and each row's own length
``positions + 1`` decides which keys count. One captured graph per batch bucket therefore serves
every sequence length, and nothing is gathered by slot.

Two kernels, one contract (:class:`InPlaceAttention`):

* ``"flex"`` — PyTorch FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5), the
  CUDA choice. GQA is native (``enable_gqa``: K/V are never repeated to the query heads) and the
  :class:`~torch.nn.attention.flex_attention.BlockMask` built from the per-row lengths lists, per
  row, only the key blocks below its length: the kernel (compiled on CUDA; its short-query "flex
  decoding" variant) never reads the rest of the slot, so a step reads the live KV, not
  ``B x max_seq_len`` positions. The mask is a fixed set of tensors rewritten in place from the
  lengths inside the step (no host sync), so a captured graph rebuilds it on every replay.
  Chosen over FlashAttention's KV-cache decode and FlashInfer because it needs no extra
  dependency, runs (unfused, same semantics) on CPU for the unit tests, and keeps the mask logic
  in our code. Eager SDPA is not an option on CUDA: with a boolean mask plus GQA, flash attention
  refuses the mask and the memory-efficient kernel refuses GQA, so it falls back to the math
  kernel (fp32 copies of K/V repeated to every query head).
* ``"sdpa"`` — ``scaled_dot_product_attention`` over the same in-place views with a boolean mask
  built from the same lengths: the CPU fallback (CPU SDPA takes the mask and GQA natively) and
  what the CPU emulation of the graph path runs; the unfused CPU FlexAttention is far slower.

Numerics are the reference's everywhere else (fp32 RMSNorm/RoPE in the layers); attention itself
differs from the eager path only in the order of summation over masked keys (last-bit
differences; the tests compare codes).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Literal

import torch
import torch.nn.functional as F

InPlaceKernel = Literal["flex", "sdpa"]
KV_BLOCK = 128
"""Key block size of the FlexAttention BlockMask (its default sparse block size)."""


def default_kernel(device: torch.device) -> InPlaceKernel:
    """FlexAttention on CUDA, SDPA elsewhere."""
    return "flex" if device.type == "cuda" else "sdpa"


@functools.cache
def _flex_attention(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        # Eager FlexAttention is the unfused reference implementation (tests only).
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention
    # One compiled specialisation per batch bucket (static shapes), compiled during warm-up and
    # never again: make room for every bucket under dynamo's per-function recompile limit.
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 64))
            break
    return torch.compile(flex_attention, dynamic=False)


def _block_mask_kwargs(max_len: int) -> dict[str, object]:
    """Options of ``BlockMask.from_kv_blocks`` that newer torch versions have: the true query and
    key lengths (one query row, not one 128-row block) and no transposed (backward-only) indices."""
    from torch.nn.attention.flex_attention import BlockMask

    params = inspect.signature(BlockMask.from_kv_blocks).parameters
    wanted: dict[str, object] = {"seq_lengths": (1, max_len), "compute_q_blocks": False}
    return {k: v for k, v in wanted.items() if k in params}


class InPlaceAttention:
    """Per-row key lengths of a B-row decode step over cache slots 0..B-1, and the attention
    that reads those slots in place (see the module docstring for the kernels).

    All tensors here are static buffers of this object: :meth:`set_lengths` rewrites them in place
    (tensor ops only), so a CUDA graph captured around the step recomputes the mask on replay.
    """

    def __init__(self, batch: int, max_len: int, device: torch.device, kernel: InPlaceKernel) -> None:
        self.batch, self.max_len, self.kernel = batch, max_len, kernel
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)
        """Keys [0, lengths[b]) of slot b are visible to row b."""
        if kernel == "sdpa":
            self._key_pos = torch.arange(max_len, device=device)
            self.mask = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=device)
            return
        from torch.nn.attention.flex_attention import BlockMask

        blocks = -(-max_len // KV_BLOCK)
        self._blocks = blocks
        # Per row: the whole blocks below its length ("full": no mask_mod needed) and at most one
        # partial block (the one holding its last key; mask_mod cuts it at the length).
        self._full_num = torch.zeros(batch, 1, 1, dtype=torch.int32, device=device)
        self._full_idx = (
            torch.arange(blocks, dtype=torch.int32, device=device).expand(batch, 1, 1, blocks).contiguous()
        )
        self._partial_num = torch.zeros(batch, 1, 1, dtype=torch.int32, device=device)
        self._partial_idx = torch.zeros(batch, 1, 1, blocks, dtype=torch.int32, device=device)
        lengths = self.lengths

        def visible(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            return kv_idx < lengths[b]

        self.block_mask = BlockMask.from_kv_blocks(
            self._partial_num,
            self._partial_idx,
            self._full_num,
            self._full_idx,
            BLOCK_SIZE=(KV_BLOCK, KV_BLOCK),
            mask_mod=visible,
            **_block_mask_kwargs(max_len),  # type: ignore[arg-type]
        )

    def set_lengths(self, lengths: torch.Tensor) -> None:
        """Rewrite the mask for per-row key counts ``lengths`` [B] (1 <= length <= max_len)."""
        self.lengths.copy_(lengths)
        if self.kernel == "sdpa":
            torch.lt(self._key_pos[None, :], self.lengths[:, None], out=self.mask[:, 0, 0])
            return
        full = torch.div(self.lengths, KV_BLOCK, rounding_mode="floor")
        self._full_num.copy_(full[:, None, None])
        self._partial_num.copy_((self.lengths % KV_BLOCK != 0)[:, None, None])
        self._partial_idx[:, 0, 0, 0].copy_(full.clamp(max=self._blocks - 1))

    def attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, enable_gqa: bool
    ) -> torch.Tensor:
        """q [B, heads, 1, hd]; keys/values [B, kv_heads, max_len, hd] (views of the cache)."""
        if self.kernel == "sdpa":
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=self.mask, scale=scale, enable_gqa=enable_gqa
            )
        flex = _flex_attention(q.device.type)
        return flex(q, keys, values, block_mask=self.block_mask, scale=scale, enable_gqa=enable_gqa)


__all__ = ["KV_BLOCK", "InPlaceAttention", "InPlaceKernel", "default_kernel"]
