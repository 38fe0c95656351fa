"""The decoder's pre-transformer: sliding-window causal attention with RoPE, ARCHITECTURE.md §9.1.

Attention sees keys ``i - window < j <= i``, so streaming keeps the last ``window`` rotated
keys/values per layer and their absolute positions (streaming protocol: see ``primitives``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tts_common.config import CodecDecoderConfig
from tts_common.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rope

from .primitives import State, Stateful, gather_time


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class DecoderAttention(Stateful):
    """Multi-head attention with RoPE; streaming state: the last ``window`` rotated keys/values."""

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.window = config.sliding_window
        bias = config.attention_bias
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        shape = (self.num_kv_heads, self.window, self.head_dim)
        return {f"{self.state_key}.k": (shape, None), f"{self.state_key}.v": (shape, None)}

    def _project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        q, k, v = self._project(x, cos, sin)
        return self._attend(q, k, v, mask)

    def step(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        lengths: Tensor | None,
        state: State,
        new_state: State,
    ) -> Tensor:
        q, k, v = self._project(x, cos, sin)
        k = torch.cat([state[f"{self.state_key}.k"], k], dim=2)
        v = torch.cat([state[f"{self.state_key}.v"], v], dim=2)
        new_state[f"{self.state_key}.k"] = gather_time(k, lengths, self.window, dim=2)
        new_state[f"{self.state_key}.v"] = gather_time(v, lengths, self.window, dim=2)
        return self._attend(q, k, v, mask)


class DecoderTransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = DecoderAttention(config)
        self.self_attn_layer_scale = LayerScale(h, config.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = GatedMLP(h, config.intermediate_size, config.hidden_act)
        self.mlp_layer_scale = LayerScale(h, config.layer_scale_initial_scale)

    def _mlp(self, x: Tensor) -> Tensor:
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return self._mlp(x)

    def step(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        lengths: Tensor | None,
        state: State,
        new_state: State,
    ) -> Tensor:
        a = self.self_attn.step(self.input_layernorm(x), cos, sin, mask, lengths, state, new_state)
        return self._mlp(x + self.self_attn_layer_scale(a))


class DecoderTransformer(Stateful):
    """input_proj -> layers -> RMSNorm -> output_proj, sliding-window causal attention.

    Streaming state (besides the per-layer keys/values): the absolute positions of the cached
    keys (``-1`` = empty slot), shared by all layers.
    """

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        assert config.head_dim is not None
        self.window = config.sliding_window
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderTransformerLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        return {f"{self.state_key}.positions": ((self.window,), torch.int64)}

    def _mask(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """[B, 1, Tq, Tk]: key j visible to query i iff i - window < j <= i (and the slot is filled)."""
        q = q_pos[:, :, None]
        k = k_pos[:, None, :]
        return ((k <= q) & (k > q - self.window) & (k >= 0))[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """x [B, T, latent] -> [B, T, latent] (positions 0..T-1)."""
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)[None].expand(b, t)
        cos, sin = self.rotary_emb(pos, x.dtype)
        mask = self._mask(pos, pos)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.output_proj(self.norm(h))

    def step(
        self, x: Tensor, positions: Tensor, lengths: Tensor | None, state: State, new_state: State
    ) -> Tensor:
        """x [B, N, latent] for absolute frame positions ``positions[b] + 0..N-1``."""
        n = x.shape[1]
        q_pos = positions[:, None] + torch.arange(n, device=x.device)
        key = f"{self.state_key}.positions"
        k_pos = torch.cat([state[key], q_pos], dim=1)
        new_state[key] = gather_time(k_pos, lengths, self.window, dim=1)
        cos, sin = self.rotary_emb(q_pos, x.dtype)
        mask = self._mask(q_pos, k_pos)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer.step(h, cos, sin, mask, lengths, state, new_state)
        return self.output_proj(self.norm(h))
