"""The audio tower: Whisper log-mel features of one utterance to audio embeddings (§12).

Numerics of the official ``Qwen3ASRAudioEncoder`` as the official aligner runs it:

* the mel frames are cut into chunks of ``2 * n_window`` (100) frames, the last one shorter; the
  chunks are zero-padded on the right to the longest chunk of the utterance (so a one-chunk
  utterance is not padded at all, and the last chunk of a longer one is padded to 100 frames:
  this changes its last valid outputs, because the GELU of the convolution bias is not zero in
  the padding);
* each chunk goes through three Conv2d(k3, s2, p1) + GELU over (mel, time), then ``conv_out`` on
  the flattened (channels x mel) axis, plus a sinusoidal position table whose positions restart
  at 0 in every chunk; only each chunk's valid frames (ceil(len / 8)) are kept and concatenated;
* the transformer layers are pre-LayerNorm blocks whose attention spans the WHOLE utterance: the
  official code passes no mask to SDPA / eager attention (its ``cu_seqlens`` windows of
  ``n_window_infer`` frames only reach flash-attention-2), and the default path is the oracle;
* ``ln_post`` -> ``proj1`` -> GELU -> ``proj2`` gives ``output_dim`` embeddings, 13 per 100 mel
  frames (one per 80 ms: one timestamp class).

Parameter names equal the checkpoint keys under ``thinker.audio_tower.``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tts_common.layers import ACTIVATIONS

from .config import AudioEncoderConfig


def audio_token_count(mel_frames: int) -> int:
    """Audio embeddings for ``mel_frames`` frames: 13 per full 100-frame chunk plus three
    stride-2 halvings (rounded up) of the rest (the official ``_get_feat_extract_output_lengths``)."""
    rest = mel_frames % 100
    length = (rest - 1) // 2 + 1
    return ((length - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // 100) * 13


def _conv_frames(frames: int) -> int:
    """Output length of the three stride-2 convolutions (k3, p1): ceil(n / 2) three times."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


class AudioAttention(nn.Module):
    """Bidirectional multi-head self-attention with biases, over one utterance."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, d] -> [T, d]."""
        t = x.shape[0]
        q, k, v = (
            proj(x).reshape(t, self.heads, self.head_dim).transpose(0, 1)[None]
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, is_causal=False)
        return self.out_proj(out[0].transpose(0, 1).reshape(t, -1))


class AudioEncoderLayer(nn.Module):
    """``x += attn(LN(x))``; ``x += fc2(act(fc1(LN(x))))`` (LayerNorm eps 1e-5)."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = AudioAttention(config.d_model, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.act = ACTIVATIONS[config.activation_function]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:  # as the official layer: keep fp16 activations finite
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(min=-limit, max=limit)
        return x


class AudioEncoder(nn.Module):
    """Log-mel features [mel, frames] of one utterance -> embeddings [audio_token_count, out]."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        mel_after = ((((config.num_mel_bins + 1) // 2) + 1) // 2 + 1) // 2
        self.conv_out = nn.Linear(hidden * mel_after, config.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = nn.LayerNorm(config.d_model)
        self.proj1 = nn.Linear(config.d_model, config.d_model)
        self.proj2 = nn.Linear(config.d_model, config.output_dim)
        self.act = ACTIVATIONS[config.activation_function]
        # Not a buffer: fp32, outside the state dict (the checkpoint has no such key), and built on
        # first use so that meta-device construction leaves nothing to materialise.
        self._positions: dict[torch.device, torch.Tensor] = {}

    def positions(self, device: torch.device) -> torch.Tensor:
        """The sinusoidal table [max_source_positions, d_model] in fp32, computed as the official
        one (log-timescale step in float64, the rest in fp32), then moved to ``device``."""
        table = self._positions.get(device)
        if table is None:
            channels, length = self.config.d_model, self.config.max_source_positions
            step = math.log(10000) / (channels // 2 - 1)
            inv_timescales = torch.exp(-step * torch.arange(channels // 2).float())
            scaled = torch.arange(length)[:, None] * inv_timescales[None, :]
            table = torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1).to(device)
            self._positions[device] = table
        return table

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [num_mel_bins, frames] (model dtype) -> [audio_token_count(frames), output_dim]."""
        frames = features.shape[1]
        chunk = 2 * self.config.n_window
        lengths = [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])
        padded = features.new_zeros(len(lengths), 1, features.shape[0], max(lengths))
        for i, part in enumerate(features.split(lengths, dim=1)):
            padded[i, 0, :, : part.shape[1]] = part
        h = F.gelu(self.conv2d1(padded))
        h = F.gelu(self.conv2d2(h))
        h = F.gelu(self.conv2d3(h))
        b, c, f, t = h.shape
        h = self.conv_out(h.permute(0, 3, 1, 2).reshape(b, t, c * f))
        h = h + self.positions(h.device)[:t].to(h.dtype)[None]
        x = torch.cat([h[i, : _conv_frames(n)] for i, n in enumerate(lengths)], dim=0)
        for layer in self.layers:
            x = layer(x)
        return self.proj2(self.act(self.proj1(self.ln_post(x))))
