"""Transformer building blocks with the reference numerics, shared by the talker (talker LM and
code predictor) and the decoder's pre-transformer.

Numerics follow docs/ARCHITECTURE.md §5/§8/§9.1 (and docs/CONVENTIONS.md):

* RMSNorm in fp32: cast to fp32, ``x * rsqrt(mean(x²) + eps)``, cast back, then multiply by the
  weight (in the activation dtype);
* RoPE (rotate-half convention) with inverse frequencies and angles computed in fp32 and the
  cos/sin tables cast to the activation dtype;
* the gated MLP ``down(act(gate(x)) * up(x))`` (SiLU for the talker, the config's activation for
  the decoder).

Parameter names equal the official checkpoint keys, so both stages load their weights strictly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
"""The ``hidden_act`` values the checkpoints' configs can name."""


class RMSNorm(nn.Module):
    """``weight * (x.float() * rsqrt(mean(x²) + eps)).to(dtype)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for integer positions, computed in fp32 then cast to the activation dtype.

    ``inv_freq`` is deliberately not a buffer: it must stay fp32 when the module is cast to
    bfloat16, must not appear in the state dict, and must survive meta-device construction. It is
    computed on the CPU (as the reference computes it at construction) and then moved, so every
    device uses the same fp32 frequencies.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """fp32 [head_dim/2] inverse frequencies (same expression as the reference)."""
        cached = self._inv_freq.get(device)
        if cached is None:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64).to(torch.float32) / self.head_dim
            cached = (1.0 / (self.theta**exponent)).to(device)
            self._inv_freq[device] = cached
        return cached

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, S] int -> (cos, sin) each [B, S, head_dim] in ``dtype``."""
        # Outer product in fp32 (a K=1 matmul in the reference: one rounding per element).
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, hd]; cos/sin [B, S, hd]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)


class GatedMLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``, no biases (SiLU by default)."""

    FUSED_PROJECTIONS = {"gate_up_proj": ("gate_proj", "up_proj")}
    """Projections of one input that a CPU kernel may compute in one call (see
    :func:`tts_common.kernels.choice.use_kernels`): ``gate_up_proj`` then replaces both."""

    def __init__(self, hidden: int, intermediate: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_proj: nn.Module | None = None
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


__all__ = ["ACTIVATIONS", "GatedMLP", "RMSNorm", "RotaryEmbedding", "apply_rope"]
