"""The Qwen3 text model of the aligner and its timestamp classifier (ARCHITECTURE.md §12).

One non-autoregressive pass over ``<|audio_start|> audio… <|audio_end|> w1 <ts><ts> w2 <ts><ts> …``
with the audio embeddings written over the ``<|audio_pad|>`` placeholders; ``lm_head`` (hidden ->
``classify_num``, no bias) is applied at the ``<timestamp>`` positions only.

Numerics follow the official ``Qwen3ASRThinkerTextModel`` (shared layers from
:mod:`tts_common.layers`): pre-RMSNorm blocks, per-head RMSNorm on q and k before RoPE, GQA,
causal attention with the left padding masked, RoPE positions ``cumsum(mask) - 1`` (so every
utterance starts at position 0 however it is padded). The release's interleaved multimodal RoPE
receives the same position on its three axes, which is plain 1-D RoPE.

Parameter names equal the checkpoint keys under ``thinker.`` (``model.*``, ``lm_head.weight``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tts_common.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rope

from .audio_encoder import AudioEncoder
from .config import ForcedAlignerConfig, TextConfig


class TextAttention(nn.Module):
    """Causal GQA self-attention with q/k RMSNorm and RoPE."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """x [B, S, H]; ``mask`` [B, 1, S, S] bool (True = may attend) or None for plain causal."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.heads != self.kv_heads
        if gqa and mask is not None:
            # As the official path: with a mask SDPA's fused kernels refuse enable_gqa (the math
            # kernel would run), so the KV heads are repeated instead.
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
            gqa = False
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and s > 1,
            scale=self.head_dim**-0.5,
            enable_gqa=gqa,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class TextDecoderLayer(nn.Module):
    """``x += attn(RMSNorm(x))``; ``x += mlp(RMSNorm(x))``."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.self_attn = TextAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Embeddings, decoder layers and the final norm (checkpoint prefix ``thinker.model.``)."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TextDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """embeds [B, S, H]; attention_mask [B, S] (1 = token, 0 = left padding) -> [B, S, H]."""
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(attention_mask == 0, 1)
        cos, sin = self.rotary(positions, embeds.dtype)
        mask = None
        if not bool(attention_mask.all()):
            s = embeds.shape[1]
            valid = attention_mask.bool()
            causal = torch.ones(s, s, dtype=torch.bool, device=embeds.device).tril()
            mask = causal[None] & valid[:, None, :]
            # A padding row would see no key at all (NaN from the softmax): let it see itself;
            # its output is never read.
            mask = mask | torch.eye(s, dtype=torch.bool, device=embeds.device)[None]
            mask = mask[:, None]
        x = embeds
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class AlignerThinker(nn.Module):
    """Audio tower + text model + timestamp classifier (checkpoint prefix ``thinker.``)."""

    def __init__(self, config: ForcedAlignerConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config.audio)
        self.model = TextModel(config.text)
        self.lm_head = nn.Linear(config.text.hidden_size, config.classify_num, bias=False)

    def timestamp_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        features: list[torch.Tensor],
    ) -> torch.Tensor:
        """Logits [n_timestamps_total, classify_num] at the ``<timestamp>`` positions, row-major
        over the batch (item 0's positions first).

        input_ids/attention_mask [B, S] left-padded; ``features[i]`` [mel, frames_i] in the model
        dtype. Each utterance's audio is encoded alone (as the official code does, and so a batch
        encodes every utterance exactly as it would be encoded alone).
        """
        embeds = self.model.embed_tokens(input_ids)
        audio = torch.cat([self.audio_tower(f) for f in features], dim=0).to(embeds.dtype)
        audio_positions = input_ids == self.config.audio_token_id
        if int(audio_positions.sum()) != audio.shape[0]:
            raise ValueError(
                f"{int(audio_positions.sum())} audio placeholders for {audio.shape[0]} audio embeddings"
            )
        embeds = embeds.masked_scatter(audio_positions[..., None], audio)
        hidden = self.model(embeds, attention_mask)
        return self.lm_head(hidden[input_ids == self.config.timestamp_token_id])
