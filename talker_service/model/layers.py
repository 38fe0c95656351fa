"""Qwen3-style attention and decoder layers shared by the talker and the code predictor.

Numerics follow docs/ARCHITECTURE.md §5/§8 (and docs/CONVENTIONS.md): the fp32 RMSNorm, fp32 RoPE
and gated MLP of :mod:`tts_common.layers` (shared with the decoder), per-head q/k RMSNorm before
RoPE, SDPA attention with scale head_dim^-0.5.
The talker's interleaved multimodal RoPE receives identical positions on its three streams for
TTS, which makes it exactly plain 1-D RoPE, so one implementation serves both modules.

The attention layer does not own a cache: callers pass the K/V buffers of this layer (see
:class:`talker_service.model.talker.KVCache`) and describe where to write and what to attend.
The eager path attends with SDPA (the reference's kernel, bit-exact official parity on CPU); the
graph path reads the cache in place with per-row lengths (:mod:`.decode_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tts_common.kernels.fused_stack import FusedStack
from tts_common.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rope

from .decode_attention import InPlaceAttention


@dataclass
class AttentionSpec:
    """How one forward call reads and writes a layer's K/V buffers (shared by all layers).

    ``k_buf``/``v_buf`` passed to the layer have shape [num_slots, kv_heads, max_len, head_dim].

    * ``slots``: ``int`` — every row is that one slot (B must be 1; prefill), views only;
      ``None`` — row b is slot b (views only); tensor [B] — slot index per row (gather/scatter).
    * ``positions`` [B, S]: cache position (= RoPE position) of each new token.
    * ``attend_len``: keys ``[0, attend_len)`` of the slot are read (a static bound: callers use a
      bucket ≥ max(position)+1 so shapes stay static for CUDA graphs).
    * ``mask``: bool [B, 1, S, attend_len] (True = visible) or None; ``is_causal``: use SDPA's
      causal mode instead (only valid when the new tokens sit at positions 0..S-1 and
      ``attend_len == S``, which is the reference's unmasked prefill path bit for bit).
    * ``prefix_only``: each new token attends exactly keys ``[0, its own position]`` of its row's
      slot (what ``mask``/``is_causal``/``attend_len`` then say too), so a stack's fused forward
      (:mod:`tts_common.kernels.fused_stack`) may run it; callers set it where that holds.
    * ``in_place``: per-row key lengths of a one-token decode step over slots 0..B-1 (``slots``
      None, ``attend_len`` = the whole slot, ``mask`` None): attention reads the cache views in
      place with its kernel instead of SDPA with ``mask``.
    """

    positions: torch.Tensor
    slots: int | torch.Tensor | None
    attend_len: int
    mask: torch.Tensor | None
    is_causal: bool
    in_place: InPlaceAttention | None = None
    prefix_only: bool = False


def _write_rows(buf: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, new: torch.Tensor) -> None:
    """``buf[slots[b], :, positions[b, s]] = new[b, :, s]`` for a contiguous ``buf`` [slots, kv,
    max_len, hd], as one ``index_copy_`` over its rows of ``hd`` values: the same copy as the
    advanced-indexing assignment, which on CPU costs 5-7x more per call (~100 vs ~20 us for a
    decode step's [8, 8, 1, 128] bf16 write on the dev EPYC; two calls per layer, 206 per frame
    at the released 0.6B dimensions)."""
    _, kv, max_len, hd = buf.shape
    heads = torch.arange(kv, device=buf.device)
    index = (slots[:, None, None] * kv + heads[None, :, None]) * max_len + positions[:, None, :]
    buf.view(-1, hd).index_copy_(0, index.reshape(-1), new.reshape(-1, hd))


def write_and_read_kv(
    k_buf: torch.Tensor, v_buf: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Store new k/v [B, kv, S, hd] at ``spec.positions`` and return the readable prefix.

    Returns keys/values [B, kv, attend_len, hd] (views when the slot mapping allows it).
    """
    b, _ = spec.positions.shape
    n = spec.attend_len
    slots = spec.slots
    if isinstance(slots, int) or slots is None:
        first = 0 if slots is None else slots
        rows = torch.arange(first, first + b, device=k.device)
        _write_rows(k_buf, rows, spec.positions, k)
        _write_rows(v_buf, rows, spec.positions, v)
        return k_buf[first : first + b, :, :n], v_buf[first : first + b, :, :n]
    _write_rows(k_buf, slots, spec.positions, k)
    _write_rows(v_buf, slots, spec.positions, v)
    return k_buf[slots, :, :n], v_buf[slots, :, :n]


class Attention(nn.Module):
    """GQA self-attention with per-head q/k RMSNorm before RoPE, no biases by default."""

    FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    """Projections of one input that a CPU kernel may compute in one call (see
    :func:`tts_common.kernels.choice.use_kernels`): ``qkv_proj`` then replaces all three."""

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool = False
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scaling = head_dim**-0.5
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.qkv_proj: nn.Module | None = None
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        spec: AttentionSpec,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        if self.qkv_proj is not None:
            kv_width = self.kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([self.heads * self.head_dim, kv_width, kv_width], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q.view(b, s, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(b, s, -1, self.head_dim)).transpose(1, 2)
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        keys, values = write_and_read_kv(k_buf, v_buf, k, v, spec)
        gqa = self.heads != self.kv_heads
        if spec.in_place is not None:
            out = spec.in_place.attend(q, keys, values, self.scaling, gqa)
        else:
            out = F.scaled_dot_product_attention(
                q,
                keys,
                values,
                attn_mask=spec.mask,
                dropout_p=0.0,
                is_causal=spec.is_causal,
                scale=self.scaling,
                enable_gqa=gqa,
            )
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x += attn(norm(x)); x += mlp(norm(x))``."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        attention_bias: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps, attention_bias)
        self.mlp = GatedMLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        spec: AttentionSpec,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_buf, v_buf, spec)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Layers + final norm; ``forward`` returns the final-norm hidden states."""

    FUSED_STACK = "fused_stack"
    """The attribute a CPU kernel set-up may fill with this stack's fused forward (see
    :func:`tts_common.kernels.choice.use_kernels`): :meth:`run_layers` then calls it for the
    specs it can run (``prefix_only``), the torch path otherwise."""

    def __init__(
        self,
        num_layers: int,
        hidden: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        rope_theta: float,
        attention_bias: bool = False,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(hidden, intermediate, heads, kv_heads, head_dim, eps, attention_bias)
            for _ in range(num_layers)
        )
        self.norm = RMSNorm(hidden, eps)
        self.rotary_emb = RotaryEmbedding(head_dim, rope_theta)
        self.fused_stack: FusedStack | None = None

    def run_layers(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        """x [B, S, H]; k/v_cache [layers, slots, kv, max_len, hd] -> final-norm hidden [B, S, H]."""
        cos, sin = self.rotary_emb(spec.positions, x.dtype)
        fused = self.fused_stack
        if (
            fused is not None
            and spec.prefix_only
            and spec.in_place is None
            and fused.accepts(x, k_cache, v_cache)
        ):
            return fused.forward(x, cos, sin, k_cache, v_cache, spec.positions, spec.slots)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, k_cache[i], v_cache[i], spec)
        return self.norm(x)
