"""The decoder's convolutional blocks: causal convs, SnakeBeta, residual units, upsampling blocks.

All stride-1 convs pad on the left only and transposed convs trim on the right only, so none needs
look-ahead (why: ``decoder`` module docstring); streaming protocol: ``primitives``.

Layout: activations keep their logical shape [B, C, T] but are laid out time-major (channels last,
strides ``(T * C, 1, C)``). oneDNN's channels-last convolutions are faster than its channels-first
ones at these shapes on CPU (the 1x1 and k7 convs of the high-rate stages the most), the transposed
convs' matmuls read and write that layout directly, and element-wise ops (SnakeBeta, residual sums)
keep the layout of their input, so no layout conversion happens between layers. Only the summation
order inside the convolutions changes (float rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tts_common.kernels.snake import snake_beta
from tts_common.onednn_linear import ROW_HINT, onednn_ops_available, packed_linear

from .primitives import DerivedCache, State, Stateful, gather_time, zero_padding

PACKED_DTYPES = (torch.float32,)
"""Dtypes whose CPU convolutions and transposed convolutions use a pre-packed oneDNN weight (see
:func:`_uses_packed_weight`). Not bfloat16: with torch 2.13 its pre-packed 768-channel k7 conv
took ~330 ms per call whatever the length (a per-call fallback), 10x ``F.conv2d``."""


def _uses_packed_weight(x: Tensor, weight: Tensor, *onednn_ops: str) -> bool:
    """Whether a call on ``x`` multiplies by ``weight`` pre-packed for oneDNN (kept beside the
    parameter): on CPU, in a :data:`PACKED_DTYPES` dtype shared by both, autograd off, and where
    this torch build has the ``torch.ops.mkldnn`` operators ``onednn_ops``."""
    return (
        x.device.type == "cpu"
        and x.dtype in PACKED_DTYPES
        and x.dtype == weight.dtype
        and not torch.is_grad_enabled()
        and onednn_ops_available(*onednn_ops)
    )


class CausalConv1d(Stateful):
    """Stride-1 causal Conv1d: left zero pad ``(k-1)*dilation`` (no right pad is needed at stride 1).

    Streaming state: the last ``(k-1)*dilation`` inputs (zeros at the start == the zero padding).

    On CPU (float32; inference, i.e. autograd off) the convolution runs oneDNN's kernel
    with the weight reordered once into oneDNN's blocked layout and kept beside the parameter
    (a second copy of the weight, recomputed when the parameter changes): ``F.conv2d`` reorders
    the whole weight on every call, which dominates the large low-rate convs on short streaming
    chunks (the 1024 -> 1536 k7 conv on a 2-frame chunk: ~7 ms instead of ~35 ms, 2 threads).
    Same kernels, same results up to float rounding (the summation order may depend on the input
    length, as it does with ``F.conv2d``).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.history = (kernel_size - 1) * dilation
        self._packed = DerivedCache()
        self._channels_last = DerivedCache()

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        if self.history == 0:
            return {}
        return {self.state_key: ((self.conv.in_channels, self.history), None)}

    def _conv(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``self.conv`` (no padding) over ``x`` [B, C, T] (plus ``residual``, same shape as the
        output), computed channels-last (class docstring; channel-major on CUDA in reduced
        precision, see below); the result is time-major too."""
        conv = self.conv
        dilation = [1, conv.dilation[0]]
        if _uses_packed_weight(x, conv.weight, "_reorder_convolution_weight", "_convolution_pointwise"):
            x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            packed = self._packed.get((conv.weight,), self._pack_weight)
            if residual is not None:  # the sum as the kernel's post-op: same bits, one pass less
                other = residual.unsqueeze(2).contiguous(memory_format=torch.channels_last)
                return torch.ops.mkldnn._convolution_pointwise.binary(
                    x4,
                    other,
                    packed,
                    conv.bias,
                    [0, 0],
                    [1, 1],
                    dilation,
                    conv.groups,
                    "add",
                    None,
                    None,
                    [],
                    None,
                ).squeeze(2)
            y = torch.ops.mkldnn._convolution_pointwise(
                x4, packed, conv.bias, [0, 0], [1, 1], dilation, conv.groups, "none", [], ""
            )
        elif x.is_cuda and x.dtype != torch.float32:
            # cuDNN (9.19, torch 2.11, H200) runs a channels-last bf16 k7 conv over a long input
            # (C 192 x 20534 samples, 384 x 5174) with a direct kernel 36x slower than on the
            # same data laid out channel-major (22.3 against 0.6 ms, the same bits): a decoder
            # chunk of 32 frame-rows took 95 ms instead of ~5. Channel-major in, the result
            # turned back time-major (two copies, microseconds).
            y = F.conv2d(
                x.unsqueeze(2).contiguous(),
                conv.weight.unsqueeze(2),
                conv.bias,
                dilation=dilation,
                groups=conv.groups,
            ).contiguous(memory_format=torch.channels_last)
        else:
            # the weight channels-last too, kept beside the parameter: given as it lies, F.conv2d
            # copies it into that layout on every call (the bf16 1024 -> 1536 k7 conv: a 22 MB
            # copy, ~10 ms a chunk on a Zen 4 EPYC)
            weight = self._channels_last.get(
                (conv.weight,), lambda: conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            )
            x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            y = F.conv2d(x4, weight, conv.bias, dilation=dilation, groups=conv.groups)
        y = y.squeeze(2)
        return y if residual is None else y + residual

    def _pack_weight(self) -> Tensor:
        """The weight in oneDNN's blocked layout for channels-last inputs (opaque tensor)."""
        conv = self.conv
        weight = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        return torch.ops.mkldnn._reorder_convolution_weight(
            weight, [0, 0], [1, 1], [1, conv.dilation[0]], conv.groups
        )

    def forward_plus(self, x: Tensor, residual: Tensor) -> Tensor:
        """``self(x) + residual`` for a conv without history (kernel 1, nothing to stream); on CPU
        in float32 the sum is fused into the convolution (a residual sum without its own pass, the
        same bits)."""
        if self.history:
            raise ValueError("forward_plus needs a kernel-1 conv")
        return self._conv(x, residual)

    def _with_history(self, history: Tensor | None, x: Tensor, act: SnakeBeta | None) -> Tensor:
        """``history ‖ act(x)`` ([B, C, history + T], zeros for ``None``), time-major.

        ``act`` writes its result straight into the buffer: concatenating afterwards would cost
        one more pass over a high-rate activation.
        """
        b, c, t = x.shape
        full = x.new_empty((b, self.history + t, c)).transpose(1, 2)
        if history is None:
            full[..., : self.history].zero_()
        else:
            full[..., : self.history] = history
        if act is None:
            full[..., self.history :] = x
        else:
            act(x, out=full[..., self.history :])
        return full

    def forward(self, x: Tensor, act: SnakeBeta | None = None) -> Tensor:
        """The conv over ``x`` (``act(x)`` if given) with the causal zero padding."""
        if self.history == 0:
            return self._conv(x if act is None else act(x))
        return self._conv(self._with_history(None, x, act))

    def step(
        self, x: Tensor, lengths: Tensor | None, state: State, new_state: State, act: SnakeBeta | None = None
    ) -> Tensor:
        """One streaming step over ``x`` (``act(x)`` if given; the state holds ``act``'s outputs)."""
        if self.history == 0:
            return self._conv(x if act is None else act(x))
        full = self._with_history(state[self.state_key], x, act)
        # row b's valid inputs end at history + lengths[b]: keep the `history` before that end
        # (a copy: a view would keep this whole chunk's input alive until the next step)
        new_state[self.state_key] = gather_time(full, lengths, self.history).clone()
        return self._conv(full)


class CausalConvTranspose1d(Stateful):
    """ConvTranspose1d(k, stride s) whose last ``k - s`` outputs are trimmed (causal).

    Computed as one matmul (every input frame times the [in, out*k] weight) followed by an
    overlap-add: PyTorch's CPU transposed convolution falls back to a slow path for short inputs
    (streaming chunks), and one formulation for both paths keeps their numerics alike. Input and
    output are time-major (module docstring): the matmul reads the input rows as they lie and the
    overlap-add writes the output in place.

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
        self._packed = DerivedCache()

    def _frames_times_weight(self, rows: Tensor) -> Tensor:
        """``rows`` [B, n, in] times the weight as [in, out * k] -> [B, n, out * k].

        On CPU in float32 (autograd off) through oneDNN with the weight packed once and kept
        beside the parameter (``tts_common.onednn_linear``): ``matmul`` repacks the whole weight
        on every call, which dominates on short streaming chunks (the 1536 -> 768 x 16 upsampler
        weight is 75 MB). Same products and sums, rounding-level differences.
        """
        weight = self.conv.weight
        c_in, cols = weight.shape[0], weight.shape[1] * weight.shape[2]
        if _uses_packed_weight(rows, weight, "_reorder_linear_weight", "_linear_pointwise"):
            packed = self._packed.get(
                (weight,),
                lambda: torch.ops.mkldnn._reorder_linear_weight(
                    weight.reshape(c_in, cols).t().contiguous(), ROW_HINT
                ),
            )
            return packed_linear(rows, packed, None, c_in, cols)
        return torch.matmul(rows, weight.reshape(c_in, cols))

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        if self.overlap == 0:
            return {}
        return {self.state_key: ((self.conv.out_channels, self.overlap), None)}

    def _full(self, x: Tensor) -> Tensor:
        """Untrimmed transposed conv without bias: [B, in, n] -> [B, out, (n + segments - 1) * s]
        (time-major, a fresh tensor)."""
        b, c_in, n = x.shape
        s, p, c_out = self.stride, self.segments, self.conv.out_channels
        # a[b, m, o, j]: contribution of input frame m to output sample m*s + j
        a = self._frames_times_weight(x.transpose(1, 2))
        a = a.view(b, n, c_out, self.kernel_size)
        if p * s != self.kernel_size:
            a = F.pad(a, (0, p * s - self.kernel_size))
        a = a.view(b, n, c_out, p, s).permute(0, 3, 1, 4, 2)  # [B, p, n, s, out]
        # y[b, f, j, o]: output sample f*s + j, time-major; segment i of frame m lands in f = m + i
        y = a.new_empty((b, n + p - 1, s, c_out))
        y[:, :n] = a[:, 0]
        y[:, n:].zero_()
        for i in range(1, p):
            y[:, i : i + n] += a[:, i]
        return y.view(b, (n + p - 1) * s, c_out).transpose(1, 2)

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
            x = zero_padding(x, lengths)
        y = self._full(x)  # a fresh tensor: the pending overlap is added in place
        y[..., : self.overlap] += state[self.state_key]
        # (a copy: a view would keep this whole step's output alive until the next step)
        if lengths is None:
            new_state[self.state_key] = y[..., n * self.stride : n * self.stride + self.overlap].clone()
        else:
            new_state[self.state_key] = gather_time(y, lengths * self.stride, self.overlap)
        return self._bias(y[..., : n * self.stride])


class SnakeBeta(nn.Module):
    """``x + 1/(exp(beta) + 1e-9) * sin(x * exp(alpha))^2`` per channel (log-scale parameters).

    Always computed in float32 (parameters kept float32 by the loader, reduced-precision inputs
    widened and the result rounded back): in half precision ``exp(beta)`` overflows and ``1e-9``
    vanishes, and in bfloat16 ``sin`` of a large ``x * exp(alpha)`` loses its phase. On CPU, for
    inference, one pass of the compiled library (:func:`tts_common.kernels.snake.snake_beta`: the
    same float32 formula, its sine within a few ulps of torch's: torch's five element-wise passes
    were a third of the bf16 decoder's CPU time, and the one pass takes 17-19% off it on a Zen 4
    EPYC); torch's formula elsewhere.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._cache = DerivedCache()

    def _coefficients(self) -> Tensor:
        alpha, beta = self.alpha.float(), self.beta.float()
        return torch.stack([torch.exp(alpha), 1.0 / (torch.exp(beta) + 1e-9)])[:, None, :, None]

    def forward(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        """The activation of ``x``; written into ``out`` (same shape and dtype) when given."""
        if not torch.is_grad_enabled():
            # on CPU one pass of the compiled library (tts_common.kernels.snake: the same float32
            # formula, its sine within a few ulps of torch's), where it can run this tensor
            alpha, inv_beta = self._cache.get((self.alpha, self.beta), self._coefficients)
            fused = snake_beta(x, alpha, inv_beta, out)
            if fused is not None:
                return fused
        if x.dtype != torch.float32:
            y = self.forward(x.float()).to(x.dtype)
            return y if out is None else out.copy_(y)
        return self._forward_f32(x, out)

    def _forward_f32(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        # tiny per-channel ops cost a thread-pool round trip each: computed once per weight load
        alpha, inv_beta = self._cache.get((self.alpha, self.beta), self._coefficients)
        if torch.is_grad_enabled():
            y = x + inv_beta * torch.pow(torch.sin(x * alpha), 2)
            return y if out is None else out.copy_(y)
        # same values (products and sums commute exactly), one full-size temporary updated in
        # place (addcmul would save a pass but rounds differently: it fuses the multiply-add)
        t = (x * alpha).sin_().pow_(2).mul_(inv_beta)
        return t.add_(x) if out is None else torch.add(t, x, out=out)


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k7 (dilated) -> SnakeBeta -> conv k1, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2.forward_plus(self.act2(self.conv1(x, act=self.act1)), x)

    def step(self, x: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        h = self.conv1.step(x, lengths, state, new_state, act=self.act1)
        return self.conv2.forward_plus(self.act2(h), x)


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
