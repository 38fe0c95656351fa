"""The 12 Hz speech-tokenizer decoder (codec codes -> 24 kHz waveform), ARCHITECTURE.md §9.1.

Plain ``nn.Module``s whose parameter (and buffer) names equal the checkpoint keys under
``decoder.`` in ``speech_tokenizer/model.safetensors``, so the official weights load strictly.

Why streaming needs no look-ahead (§9.1 padding rules): every conv of the decoder has stride 1,
so the official causal padding is ``(k-1)*dilation`` zeros on the left and no right padding (the
"complete the last stride" pad is 0 at stride 1); transposed convs trim only on the right, so output
sample ``t`` depends on inputs ``<= t // stride``; attention sees keys ``j <= i``; the quantizer,
LayerNorm/RMSNorm, linear layers and SnakeBeta act per time step. Hence no output sample is held
back: a chunk of ``n`` frames yields its ``n * samples_per_frame`` samples at once.

Every module has two entry points:

* ``forward(x)`` — whole-utterance computation with the official padding rules (the reference
  path, checked against the official outputs in the fixtures);
* ``step(x, lengths, state, new_state)`` — incremental computation for streaming. Every op of the
  network is causal (stride-1 convs pad only on the left, transposed convs trim only on the right,
  attention is causal with a sliding window), so a step needs only *past* context, held in a small
  fixed-size state per stream; no output sample is ever held back. Feeding frames in any chunking
  yields the samples of the whole-utterance decode of those frames (up to float rounding).

Batched steps advance many streams at once: each row of a batch holds one stream, rows are
right-padded to the longest chunk, ``lengths`` gives each row's valid length at the module's
time resolution (``None`` = every row fully valid) and every state is re-extracted at the row's
own valid end (``_gather_time``). Padded positions only influence padded outputs (everything is
causal), except where noted (transposed-conv overlap: padded inputs are zeroed first).

State tensors all have a fixed shape (batch first) that does not depend on the stream position,
which keeps batched steps static-shape friendly (CUDA graphs, see ``cuda_graphs.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tts_common.config import CodecDecoderConfig, SpeechTokenizerConfig, load_checkpoint_config
from tts_common.weights import load_module_weights

CHECKPOINT_PREFIX = "decoder."
"""Key prefix of the decoder's tensors in ``speech_tokenizer/model.safetensors``."""

OFFICIAL_CHUNK_SIZE = 300
OFFICIAL_LEFT_CONTEXT = 25

State = dict[str, Tensor]
"""Streaming state of a batch of streams: state key (module path, plus a suffix) -> tensor whose
first dimension is the batch."""


# --------------------------------------------------------------------------------------------
# helpers


def _gather_time(x: Tensor, start: Tensor | None, size: int, dim: int = -1) -> Tensor:
    """``x[b, ..., start[b] : start[b] + size, ...]`` along ``dim`` for every row ``b``.

    ``start=None`` means "the last ``size`` steps" for every row (the fast, all-rows-full case).
    """
    dim = dim % x.dim()
    if start is None:
        return x.narrow(dim, x.shape[dim] - size, size)
    idx = start[:, None] + torch.arange(size, device=x.device)  # [B, size]
    view = [x.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = size
    idx = idx.view(view).expand(*[size if d == dim else s for d, s in enumerate(x.shape)])
    return torch.gather(x, dim, idx)


def _zero_padding(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` [B, C, T] with every step ``t >= lengths[b]`` of row ``b`` set to 0."""
    t = torch.arange(x.shape[-1], device=x.device)
    return torch.where(
        (t[None, :] < lengths[:, None])[:, None, :], x, torch.zeros((), dtype=x.dtype, device=x.device)
    )


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class _DerivedCache:
    """A tensor derived from parameters/buffers, recomputed only when they change.

    In-place updates (``load_state_dict``) bump a tensor's ``_version`` and ``.to()`` changes its
    storage, so (data_ptr, _version) identifies the sources' contents. Not cached while autograd
    is recording (the cached value must not carry a graph).
    """

    def __init__(self) -> None:
        self._key: Any = None
        self._value: Tensor | None = None

    def get(self, sources: tuple[Tensor, ...], compute: Callable[[], Tensor]) -> Tensor:
        if torch.is_grad_enabled():
            return compute()
        try:
            key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in sources)
        except RuntimeError:  # inference tensors track no version
            return compute()
        if self._value is None or key != self._key:
            self._value, self._key = compute(), key
        return self._value


class _Stateful(nn.Module):
    """A module that keeps streaming state; ``state_key`` is set to its module path."""

    state_key: str = ""

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        """State entries: key -> (shape without batch, dtype; None = the model's float dtype)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# convolutions


class CausalConv1d(_Stateful):
    """Stride-1 causal Conv1d: left zero pad ``(k-1)*dilation`` (no right pad is needed at stride 1).

    Streaming state: the last ``(k-1)*dilation`` inputs (zeros at the start == the zero padding).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history = (kernel_size - 1) * dilation

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        if self.history == 0:
            return {}
        return {self.state_key: ((self.conv.in_channels, self.history), None)}

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.history, 0)))

    def step(self, x: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        if self.history == 0:
            return self.conv(x)
        full = torch.cat([state[self.state_key], x], dim=-1)
        # row b's valid inputs end at history + lengths[b]: keep the `history` before that end.
        new_state[self.state_key] = _gather_time(full, lengths, self.history)
        return self.conv(full)


class CausalConvTranspose1d(_Stateful):
    """ConvTranspose1d(k, stride s) whose last ``k - s`` outputs are trimmed (causal).

    Computed as one matmul (every input frame times the [in, out*k] weight) followed by an
    overlap-add: PyTorch's CPU transposed convolution falls back to a slow path for short inputs
    (streaming chunks), and one formulation for both paths keeps their numerics alike.

    Streaming state: the pending overlap — the ``k - s`` output samples past the current end that
    the inputs seen so far already contribute to (without bias); the next step adds them to its
    first outputs. Kernels with ``k == s`` have no overlap and no state.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.kernel_size = kernel_size
        self.overlap = kernel_size - stride
        self.segments = math.ceil(kernel_size / stride)

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        if self.overlap == 0:
            return {}
        return {self.state_key: ((self.conv.out_channels, self.overlap), None)}

    def _full(self, x: Tensor) -> Tensor:
        """Untrimmed transposed conv without bias: [B, in, n] -> [B, out, (n + segments - 1) * s]."""
        b, c_in, n = x.shape
        s, p, c_out = self.stride, self.segments, self.conv.out_channels
        # a[b, m, o, j]: contribution of input frame m to output sample m*s + j
        a = torch.matmul(x.transpose(1, 2), self.conv.weight.reshape(c_in, c_out * self.kernel_size))
        a = a.view(b, n, c_out, self.kernel_size)
        if p * s != self.kernel_size:
            a = F.pad(a, (0, p * s - self.kernel_size))
        a = a.view(b, n, c_out, p, s).permute(0, 2, 3, 1, 4)  # [B, out, p, n, s]
        if p == 1:
            return a[:, :, 0].reshape(b, c_out, n * s)
        y = a.new_zeros((b, c_out, n + p - 1, s))
        for i in range(p):
            y[:, :, i : i + n] += a[:, :, i]
        return y.view(b, c_out, (n + p - 1) * s)

    def _bias(self, y: Tensor) -> Tensor:
        return y if self.conv.bias is None else y + self.conv.bias[:, None]

    def forward(self, x: Tensor) -> Tensor:
        return self._bias(self._full(x)[..., : x.shape[-1] * self.stride])

    def step(self, x: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        n = x.shape[-1]
        if self.overlap == 0:  # each input maps to its own `stride` outputs
            return self._bias(self._full(x))
        if lengths is not None:
            # padded inputs must not leak into the pending overlap of their row
            x = _zero_padding(x, lengths)
        y = self._full(x)
        y = torch.cat([y[..., : self.overlap] + state[self.state_key], y[..., self.overlap :]], dim=-1)
        if lengths is None:
            new_state[self.state_key] = y[..., n * self.stride : n * self.stride + self.overlap]
        else:
            new_state[self.state_key] = _gather_time(y, lengths * self.stride, self.overlap)
        return self._bias(y[..., : n * self.stride])


class SnakeBeta(nn.Module):
    """``x + 1/(exp(beta) + 1e-9) * sin(x * exp(alpha))^2`` per channel (log-scale parameters)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._cache = _DerivedCache()

    def _coefficients(self) -> Tensor:
        return torch.stack([torch.exp(self.alpha), 1.0 / (torch.exp(self.beta) + 1e-9)])[:, None, :, None]

    def forward(self, x: Tensor) -> Tensor:
        # tiny per-channel ops cost a thread-pool round trip each: computed once per weight load
        alpha, inv_beta = self._cache.get((self.alpha, self.beta), self._coefficients)
        if torch.is_grad_enabled():
            return x + inv_beta * torch.pow(torch.sin(x * alpha), 2)
        # same values (products and sums commute exactly), two fewer full-size temporaries
        return torch.sin(x * alpha).pow_(2).mul_(inv_beta).add_(x)


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k7 (dilated) -> SnakeBeta -> conv k1, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.act2(self.conv1(self.act1(x)))) + x

    def step(self, x: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        h = self.conv1.step(self.act1(x), lengths, state, new_state)
        return self.conv2(self.act2(h)) + x


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal ConvTranspose1d(C -> C/2, k=2r, s=r) -> residual units (dil 1, 3, 9)."""

    def __init__(self, in_dim: int, out_dim: int, rate: int) -> None:
        super().__init__()
        self.rate = rate
        self.block = nn.ModuleList(
            [
                SnakeBeta(in_dim),
                CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate),
                ResidualUnit(out_dim, 1),
                ResidualUnit(out_dim, 3),
                ResidualUnit(out_dim, 9),
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.block:
            x = layer(x)
        return x

    def step(
        self, x: Tensor, lengths: Tensor | None, state: State, new_state: State
    ) -> tuple[Tensor, Tensor | None]:
        x = self.block[0](x)
        x = self.block[1].step(x, lengths, state, new_state)
        lengths = None if lengths is None else lengths * self.rate
        for unit in self.block[2:]:
            x = unit.step(x, lengths, state, new_state)
        return x, lengths


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm(1e-6) -> Linear 4x -> GELU -> Linear -> gamma, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def _pointwise(self, x: Tensor, h: Tensor) -> Tensor:
        h = h.transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self._pointwise(x, self.dwconv(x))

    def step(self, x: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        return self._pointwise(x, self.dwconv.step(x, lengths, state, new_state))


# --------------------------------------------------------------------------------------------
# split residual vector quantizer (decode only)


class EuclideanCodebook(nn.Module):
    """One VQ codebook: entry = ``embedding_sum / clamp(cluster_usage, 1e-5)``."""

    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(codebook_size))
        self.register_buffer("embedding_sum", torch.zeros(codebook_size, dim))
        self._cache = _DerivedCache()

    def table(self) -> Tensor:
        """The [codebook_size, dim] embedding table (cached until the buffers change)."""
        return self._cache.get(
            (self.embedding_sum, self.cluster_usage),
            lambda: self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None],
        )


class _VQLayer(nn.Module):
    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size)


class _VQLayers(nn.Module):
    def __init__(self, n: int, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQLayer(dim, codebook_size) for _ in range(n)])


class ResidualVectorQuantizer(nn.Module):
    """``n`` codebooks of dim ``codebook_dim/2``; decode = sum of entries -> output_proj (k1)."""

    def __init__(self, n_q: int, codebook_dim: int, codebook_size: int) -> None:
        super().__init__()
        half = codebook_dim // 2
        # input_proj is only used to encode; kept so the checkpoint loads strictly.
        self.input_proj = nn.Conv1d(codebook_dim, half, 1, bias=False)
        self.output_proj = nn.Conv1d(half, codebook_dim, 1, bias=False)
        self.vq = _VQLayers(n_q, half, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, n_q, T] -> [B, codebook_dim, T]."""
        quantized: Tensor | None = None
        for i, layer in enumerate(self.vq.layers):
            emb = F.embedding(codes[:, i], layer._codebook.table())  # [B, T, half]
            quantized = emb if quantized is None else quantized + emb
        assert quantized is not None
        return self.output_proj(quantized.transpose(1, 2))


class SplitResidualVectorQuantizer(nn.Module):
    """Codebook 0 through ``rvq_first``, codebooks 1.. through ``rvq_rest``; outputs added."""

    def __init__(self, num_quantizers: int, codebook_dim: int, codebook_size: int) -> None:
        super().__init__()
        self.rvq_first = ResidualVectorQuantizer(1, codebook_dim, codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(num_quantizers - 1, codebook_dim, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, num_quantizers, T] (all >= 0) -> [B, codebook_dim, T]."""
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# --------------------------------------------------------------------------------------------
# pre-transformer (sliding-window causal attention)


class RMSNorm(nn.Module):
    """fp32 RMSNorm: cast, ``x * rsqrt(mean(x^2) + eps)``, cast back, ``weight * normalized``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class DecoderMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = _ACTIVATIONS[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D]; cos/sin [B, T, D]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class DecoderAttention(_Stateful):
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
        return _apply_rope(q, cos, sin), _apply_rope(k, cos, sin), v

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
        new_state[f"{self.state_key}.k"] = _gather_time(k, lengths, self.window, dim=2)
        new_state[f"{self.state_key}.v"] = _gather_time(v, lengths, self.window, dim=2)
        return self._attend(q, k, v, mask)


class DecoderTransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = DecoderAttention(config)
        self.self_attn_layer_scale = LayerScale(h, config.layer_scale_initial_scale)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = DecoderMLP(h, config.intermediate_size, config.hidden_act)
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


class DecoderTransformer(_Stateful):
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
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        # not a buffer: `.to(bfloat16)` must not round the fp32 RoPE frequencies
        self._inv_freq: dict[torch.device, Tensor] = {}

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        return {f"{self.state_key}.positions": ((self.window,), torch.int64)}

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin [B, T, head_dim] for absolute positions [B, T]; fp32 tables cast to ``dtype``."""
        inv_freq = self._inv_freq.get(positions.device)
        if inv_freq is None:
            dim = self.head_dim
            exponents = (
                torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).to(torch.float32) / dim
            )
            inv_freq = self._inv_freq[positions.device] = 1.0 / (self.rope_theta**exponents)
        freqs = positions.to(torch.float32)[..., None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _mask(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """[B, 1, Tq, Tk]: key j visible to query i iff i - window < j <= i (and the slot is filled)."""
        q = q_pos[:, :, None]
        k = k_pos[:, None, :]
        return ((k <= q) & (k > q - self.window) & (k >= 0))[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """x [B, T, latent] -> [B, T, latent] (positions 0..T-1)."""
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device)[None].expand(b, t)
        cos, sin = self._rope(pos, x.dtype)
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
        new_state[key] = _gather_time(k_pos, lengths, self.window, dim=1)
        cos, sin = self._rope(q_pos, x.dtype)
        mask = self._mask(q_pos, k_pos)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer.step(h, cos, sin, mask, lengths, state, new_state)
        return self.output_proj(self.norm(h))


# --------------------------------------------------------------------------------------------
# the decoder


class CodecDecoder(nn.Module):
    """Qwen3-TTS 12 Hz speech-tokenizer decoder: codes [B, 16, T] -> 24 kHz audio in [-1, 1].

    Whole-utterance: :meth:`decode` (one pass, exact) and :meth:`decode_official_chunked` (the
    official ``chunked_decode``: equal to :meth:`decode` up to 300 frames). Streaming:
    :meth:`init_state` / :meth:`step`, usually through ``streaming.DecoderSession``.
    """

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.num_quantizers = config.num_quantizers
        self.cpu_back_group_frames: int | None = 32
        """On CPU, :meth:`step` runs the high-rate conv stack over groups of rows totalling at most
        this many frames (None: all rows at once). Batching buys little there on CPU (its convs
        already have long time axes) while batch-sized activations (hundreds of MB at 1920x)
        thrash caches and the allocator (fresh pages for every large tensor)."""
        self.quantizer = SplitResidualVectorQuantizer(
            config.num_quantizers, config.codebook_dim, config.codebook_size
        )
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, 3)
        self.pre_transformer = DecoderTransformer(config)
        self.upsample = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        CausalConvTranspose1d(config.latent_dim, config.latent_dim, r, r),
                        ConvNeXtBlock(config.latent_dim),
                    ]
                )
                for r in config.upsampling_ratios
            ]
        )
        self.upsample_factor = math.prod(config.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, 7)]
        dim = config.decoder_dim
        for rate in config.upsample_rates:
            layers.append(DecoderBlock(dim, dim // 2, rate))
            dim //= 2
        layers += [SnakeBeta(dim), CausalConv1d(dim, 1, 7)]
        self.decoder = nn.ModuleList(layers)
        for name, module in self.named_modules():
            if isinstance(module, _Stateful):
                module.state_key = name

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> CodecDecoder:
        """Load from a model directory (with ``speech_tokenizer/``) or a speech-tokenizer directory.

        Strict: every ``decoder.*`` tensor must match a parameter/buffer and vice versa. ``dtype``
        float32 (default, like the official loader without ``dtype``) or bfloat16.
        """
        root = Path(path)
        if (root / "speech_tokenizer" / "config.json").is_file():
            st_dir = root / "speech_tokenizer"
            config = load_checkpoint_config(root).speech_tokenizer
        else:
            st_dir = root
            with open(root / "config.json", encoding="utf-8") as fh:
                config = SpeechTokenizerConfig.from_dict(json.load(fh))
        decoder = cls(config.decoder)
        load_module_weights(decoder, st_dir / "model.safetensors", CHECKPOINT_PREFIX, dtype=dtype)
        return decoder.to(device=device, dtype=dtype).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    # ---------------------------------------------------------------- whole utterance

    def forward(self, codes: Tensor) -> Tensor:
        """The official forward: codes [B, Q, T] (>= 0) -> clamped audio [B, 1, T * samples_per_frame]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(
                f"expected {self.num_quantizers} codebooks, got codes of shape {tuple(codes.shape)}"
            )
        h = self.quantizer.decode(codes)
        h = self.pre_conv(h).transpose(1, 2)
        h = self.pre_transformer(h).transpose(1, 2)
        for convt, convnext in self.upsample:  # type: ignore[misc]
            h = convnext(convt(h))
        for layer in self.decoder:
            h = layer(h)
        return h.clamp(min=-1, max=1)

    def _as_batch(self, codes: Tensor) -> tuple[Tensor, bool]:
        """Accept [B, Q, T] or [T, Q]; padding (-1) becomes 0 as in the official ``decode``."""
        codes = torch.as_tensor(codes, device=self.device).long()
        single = codes.dim() == 2
        if single:
            if codes.shape[1] != self.num_quantizers:
                raise ValueError(f"expected codes [T, {self.num_quantizers}], got {tuple(codes.shape)}")
            codes = codes.t()[None]
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected codes [B, {self.num_quantizers}, T], got {tuple(codes.shape)}")
        return codes.clamp(min=0), single

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """Exact whole-utterance decode in one pass.

        codes [B, Q, T] -> float32 [B, T * samples_per_frame]; codes [T, Q] -> [T * samples_per_frame].
        """
        batch, single = self._as_batch(codes)
        wav = self(batch)[:, 0].float()
        return wav[0] if single else wav

    @torch.inference_mode()
    def decode_official_chunked(
        self, codes: Tensor, chunk_size: int = OFFICIAL_CHUNK_SIZE, left_context: int = OFFICIAL_LEFT_CONTEXT
    ) -> Tensor:
        """The official ``chunked_decode``: 300-frame chunks, each after the first decoded with 25
        frames of left context whose audio is dropped. Same shapes as :meth:`decode`."""
        batch, single = self._as_batch(codes)
        total = batch.shape[-1]
        pieces: list[Tensor] = []
        start = 0
        while start < total:
            end = min(start + chunk_size, total)
            context = left_context if start - left_context > 0 else start
            wav = self(batch[..., start - context : end])
            pieces.append(wav[..., context * self.samples_per_frame :])
            start = end
        if not pieces:
            wav = batch.new_zeros((batch.shape[0], 0), dtype=torch.float32)
        else:
            wav = torch.cat(pieces, dim=-1)[:, 0].float()
        return wav[0] if single else wav

    @torch.inference_mode()
    def decode_utterances(
        self, codes: list[Tensor], prefixes: list[Tensor | None] | None = None, official_chunking: bool = True
    ) -> list[Tensor]:
        """Decode a batch of utterances like the official wrapper (float32, 1-D each).

        ``codes[i]`` is [T_i, Q]. With ``prefixes[i]`` (voice-clone ICL reference codes) the item
        decoded is ``prefix ‖ codes`` and the reference part is cut exactly like the official code:
        ``cut = int(ref_len / max(total_len, 1) * wav_len)`` (Python floats; this can keep one
        sample of reference audio for some lengths).
        """
        prefixes = prefixes or [None] * len(codes)
        items = []
        for c, p in zip(codes, prefixes):
            c = torch.as_tensor(c).long()
            items.append(c if p is None else torch.cat([torch.as_tensor(p).long().to(c.device), c], dim=0))
        if not items:
            return []
        longest = max(int(x.shape[0]) for x in items)
        batch = torch.full(
            (len(items), self.num_quantizers, longest), -1, dtype=torch.long, device=self.device
        )
        for i, x in enumerate(items):
            batch[i, :, : x.shape[0]] = x.t().to(self.device)
        wavs = self.decode_official_chunked(batch) if official_chunking else self.decode(batch)
        out: list[Tensor] = []
        for i, (x, p) in enumerate(zip(items, prefixes)):
            wav = wavs[i, : x.shape[0] * self.samples_per_frame]
            if p is not None:
                wav = wav[icl_cut(int(p.shape[0]), int(x.shape[0]), int(wav.shape[0])) :]
            out.append(wav)
        return out

    # ---------------------------------------------------------------- streaming

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        spec: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {}
        for module in self.modules():
            if isinstance(module, _Stateful):
                spec.update(module.state_spec())
        return spec

    def init_state(self, batch: int = 1) -> State:
        """Zero streaming state for ``batch`` fresh streams (empty attention slots = position -1)."""
        state: State = {}
        for key, (shape, dtype) in self.state_spec().items():
            if dtype is torch.int64:
                state[key] = torch.full((batch, *shape), -1, dtype=torch.int64, device=self.device)
            else:
                state[key] = torch.zeros((batch, *shape), dtype=self.dtype, device=self.device)
        return state

    def is_back_key(self, key: str) -> bool:
        """Whether a state entry belongs to the conv stack after the upsampler (``decoder.*``)."""
        return key.startswith("decoder.")

    def step_front(
        self, codes: Tensor, positions: Tensor, lengths: Tensor | None, state: State, new_state: State
    ) -> tuple[Tensor, Tensor | None]:
        """Quantizer, pre_conv, pre_transformer and upsampler for one step.

        codes [B, Q, N] (>= 0), positions [B] (frames already consumed per row), lengths [B] valid
        frames per row or None. Returns hidden [B, latent, N * upsample_factor] and its lengths.
        """
        h = self.quantizer.decode(codes)
        h = self.pre_conv.step(h, lengths, state, new_state).transpose(1, 2)
        h = self.pre_transformer.step(h, positions, lengths, state, new_state).transpose(1, 2)
        for convt, convnext in self.upsample:  # type: ignore[misc]
            h = convt.step(h, lengths, state, new_state)
            lengths = None if lengths is None else lengths * convt.stride
            h = convnext.step(h, lengths, state, new_state)
        return h, lengths

    def step_back(self, h: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        """The conv stack (``decoder.*``) for one step: hidden -> clamped audio [B, T_out] (model dtype)."""
        first, *blocks, act, last = self.decoder
        h = first.step(h, lengths, state, new_state)
        for block in blocks:
            h, lengths = block.step(h, lengths, state, new_state)
        h = last.step(act(h), lengths, state, new_state)
        return h[:, 0].clamp(min=-1, max=1)

    def step(
        self, codes: Tensor, positions: Tensor, lengths: Tensor | None, state: State
    ) -> tuple[Tensor, State]:
        """Advance a batch of streams: returns float32 audio [B, N * samples_per_frame] and the new
        state. Row b's valid audio is its first ``lengths[b] * samples_per_frame`` samples; its new
        state reflects exactly its first ``lengths[b]`` frames. No host synchronisation, no
        data-dependent shapes (CUDA-graph capturable)."""
        new_state: State = {}
        h, up_lengths = self.step_front(codes.clamp(min=0), positions, lengths, state, new_state)
        rows, frames = codes.shape[0], codes.shape[-1]
        group = rows
        if self.cpu_back_group_frames is not None and h.device.type == "cpu":
            group = max(1, self.cpu_back_group_frames // max(frames, 1))
        if group >= rows:
            wav = self.step_back(h, up_lengths, state, new_state)
            return wav.float(), new_state
        # rows are independent in the conv stack: run it on groups of rows (exact) so that its
        # large high-rate activations stay small (see `cpu_back_group_frames`)
        back_keys = [k for k in state if self.is_back_key(k)]
        pieces: list[Tensor] = []
        parts: dict[str, list[Tensor]] = {k: [] for k in back_keys}
        for r0 in range(0, rows, group):
            rs = slice(r0, r0 + group)
            sub_new: State = {}
            sub_lengths = None if up_lengths is None else up_lengths[rs]
            pieces.append(self.step_back(h[rs], sub_lengths, {k: state[k][rs] for k in back_keys}, sub_new))
            for k in back_keys:
                parts[k].append(sub_new[k])
        new_state.update({k: torch.cat(v) for k, v in parts.items()})
        return torch.cat(pieces).float(), new_state

    def back_receptive_frames(self) -> int:
        """Codec frames of input the conv stack's streaming state can depend on (upper bound).

        Because the stack is feed-forward and causal (finite impulse response), running it from a
        zero state over the last ``back_receptive_frames()`` frames of a prefix yields exactly the
        state that running it over the whole prefix would (used to consume long ICL prefixes
        cheaply: the expensive high-rate stack only runs on the prefix tail).
        """
        span = 0.0  # in codec frames
        rate = float(self.upsample_factor)  # samples per frame at the current layer's input
        first, *blocks, _act, last = self.decoder
        span += first.history / rate
        for block in blocks:
            convt = block.block[1]
            span += (1 + math.ceil(convt.overlap / convt.stride)) / rate
            rate *= convt.stride
            for unit in block.block[2:]:
                span += unit.conv1.history / rate
        span += last.history / rate
        return math.ceil(span) + 1


def icl_cut(ref_frames: int, total_frames: int, wav_samples: int) -> int:
    """Samples of reference audio the official voice-clone code cuts from ``ref ‖ generated``.

    ``int(ref_len / max(total_len, 1) * wav_len)`` in Python floats: usually ``ref_frames *
    samples_per_frame``, but one less for some lengths (then the official output starts with the
    reference audio's last sample).
    """
    return int(ref_frames / max(total_frames, 1) * wav_samples)


def init_random_weights(decoder: CodecDecoder, seed: int = 0, scale: float = 1.0) -> CodecDecoder:
    """Fill ``decoder`` with deterministic random weights (tests and benchmarks; no checkpoint).

    Fan-in scaled so activations stay O(1) through the whole chain and the output is not clamped
    everywhere; residual scales (LayerScale, ConvNeXt gamma) are made large enough that every path
    matters numerically.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size, std: float) -> Tensor:
        return torch.randn(shape, generator=gen) * std

    with torch.no_grad():
        for module in decoder.modules():
            if isinstance(module, nn.ConvTranspose1d):
                # weight [in, out, k]: each output sample sums in * k / stride products
                w = module.weight
                fan_in = w.shape[0] * w.shape[2] // module.stride[0]
                w.copy_(normal(w.shape, scale / math.sqrt(fan_in)))
            elif isinstance(module, (nn.Conv1d, nn.Linear)):
                w = module.weight
                w.copy_(normal(w.shape, scale / math.sqrt(w[0].numel())))
            elif isinstance(module, (RMSNorm, nn.LayerNorm)):
                module.weight.copy_(1.0 + normal(module.weight.shape, 0.1))
            elif isinstance(module, SnakeBeta):
                module.alpha.copy_(normal(module.alpha.shape, 0.3))
                module.beta.copy_(normal(module.beta.shape, 0.3))
            elif isinstance(module, LayerScale):
                module.scale.copy_(normal(module.scale.shape, 0.1).abs())
            elif isinstance(module, ConvNeXtBlock):
                module.gamma.copy_(normal(module.gamma.shape, 0.1).abs())
            elif isinstance(module, EuclideanCodebook):
                usage = torch.rand(module.cluster_usage.shape, generator=gen) * 2 + 0.5
                module.cluster_usage.copy_(usage)
                # entries ~ N(0, 1/num_quantizers) so the sum over codebooks is O(1)
                std = 1.0 / math.sqrt(decoder.num_quantizers)
                module.embedding_sum.copy_(normal(module.embedding_sum.shape, std) * usage[:, None])
            bias = getattr(module, "bias", None)
            if (
                isinstance(module, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear, nn.LayerNorm))
                and bias is not None
            ):
                bias.copy_(normal(bias.shape, 0.02))
        # residual units: a small residual branch keeps the activation scale flat across blocks
        for module in decoder.modules():
            if isinstance(module, ResidualUnit):
                module.conv2.conv.weight.mul_(0.3)
        # keep the output in a sensible range so little is clamped
        decoder.decoder[-1].conv.weight.mul_(0.15)
    return decoder
