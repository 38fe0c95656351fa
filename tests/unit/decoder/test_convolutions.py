"""The decoder's convolutions against torch's reference ops, and their time-major layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder_service.model import convolutions
from decoder_service.model.convolutions import CausalConv1d, CausalConvTranspose1d, DecoderBlock, SnakeBeta
from decoder_service.model.primitives import State
from tests.helpers.decoder import snake_tolerance
from tts_common.kernels.gemv import gemv_available

ROUNDING = 1e-5  # float32, O(1) values: only the summation order differs from torch's ops


def _is_time_major(x: torch.Tensor) -> bool:
    """Each row laid out time-major: channels adjacent, time steps ``C`` apart."""
    return x.stride(1) == 1 and x.stride(2) == x.shape[1]


def _input(batch: int, channels: int, frames: int, time_major: bool, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if time_major:
        return torch.randn(batch, frames, channels, generator=gen).transpose(1, 2)
    return torch.randn(batch, channels, frames, generator=gen)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    groups=st.integers(1, 3),
    per_group=st.integers(1, 4),
    out_per_group=st.integers(1, 4),
    kernel=st.sampled_from([1, 3, 7]),
    dilation=st.sampled_from([1, 3, 9]),
    frames=st.integers(1, 40),
    time_major=st.booleans(),
    with_act=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_causal_conv_equals_left_padded_conv1d(
    batch: int,
    groups: int,
    per_group: int,
    out_per_group: int,
    kernel: int,
    dilation: int,
    frames: int,
    time_major: bool,
    with_act: bool,
    seed: int,
) -> None:
    """Also with the activation written straight into the conv's padded input (``act=``)."""
    torch.manual_seed(seed)
    conv = CausalConv1d(groups * per_group, groups * out_per_group, kernel, dilation, groups).eval()
    act = SnakeBeta(groups * per_group)
    with torch.no_grad():
        act.alpha.normal_()
        act.beta.normal_()
    x = _input(batch, groups * per_group, frames, time_major, seed)
    with torch.inference_mode():
        want = conv.conv(F.pad(act(x) if with_act else x, ((kernel - 1) * dilation, 0)))
        got = conv(x, act=act) if with_act else conv(x)
    assert got.shape == want.shape
    assert _is_time_major(got)
    assert float((got - want).abs().max()) < ROUNDING


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    c_in=st.integers(1, 6),
    c_out=st.integers(1, 6),
    stride=st.integers(1, 5),
    extra=st.integers(0, 6),
    frames=st.integers(1, 12),
    time_major=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_causal_transposed_conv_equals_trimmed_conv_transpose1d(
    batch: int, c_in: int, c_out: int, stride: int, extra: int, frames: int, time_major: bool, seed: int
) -> None:
    """Kernels from ``stride`` (no overlap) to ``stride + 6`` (overlaps over several frames)."""
    torch.manual_seed(seed)
    convt = CausalConvTranspose1d(c_in, c_out, stride + extra, stride).eval()
    x = _input(batch, c_in, frames, time_major, seed)
    with torch.inference_mode():
        want = convt.conv(x)[..., : frames * stride]
        got = convt(x)
    assert got.shape == want.shape
    assert _is_time_major(got)
    assert float((got - want).abs().max()) < ROUNDING


def test_decoder_block_step_keeps_the_time_major_layout() -> None:
    """No layer of a block's streamed step hands the next one a channels-first tensor (each such
    hand-over would cost a layout copy of a high-rate activation)."""
    torch.manual_seed(0)
    block = DecoderBlock(8, 4, 3).eval()
    for name, module in block.named_modules():
        if hasattr(module, "state_key"):
            module.state_key = name
    state: State = {}
    for module in block.modules():
        if hasattr(module, "state_spec"):
            for key, (shape, _) in module.state_spec().items():
                state[key] = torch.zeros((2, *shape))
    seen: list[tuple[str, bool]] = []
    hooks = [
        m.register_forward_hook(lambda mod, _i, out, n=n: seen.append((n, _is_time_major(out))))
        for n, m in block.named_modules()
        if n
    ]
    x = _input(2, 8, 5, True, 0)
    with torch.inference_mode():
        out, _ = block.step(x, None, state, {})
    for h in hooks:
        h.remove()
    assert _is_time_major(out)
    assert seen and all(tm for _, tm in seen), seen


@settings(max_examples=30, deadline=None)
@given(
    channels=st.integers(1, 8), frames=st.integers(1, 50), time_major=st.booleans(), seed=st.integers(0, 1000)
)
def test_snake_inference_paths_equal_the_formula(
    channels: int, frames: int, time_major: bool, seed: int
) -> None:
    """Without the compiled library, the fused in-place torch computation gives exactly the
    autograd path's formula; with it (CPU inference), the library's one pass agrees within its
    sine's few ulps (tests/unit/common/test_snake.py) and keeps the layout."""
    gen = torch.Generator().manual_seed(seed)
    snake = SnakeBeta(channels)
    with torch.no_grad():
        snake.alpha.copy_(torch.randn(channels, generator=gen))
        snake.beta.copy_(torch.randn(channels, generator=gen))
    x = _input(2, channels, frames, time_major, seed) * 4
    want = snake(x).detach()  # autograd on: x + inv_beta * sin(x * alpha) ** 2
    with torch.inference_mode():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(convolutions, "snake_beta", lambda *args: None)  # the torch path
            torch_path = snake(x)
        got = snake(x)
    assert torch.equal(torch_path, want)
    if gemv_available():
        inv_beta = 1.0 / (snake.beta.exp() + 1e-9)
        assert ((got - want).abs() <= snake_tolerance(want, inv_beta)).all()
    for out in (got, torch_path):
        if channels > 1 and frames > 1:  # (otherwise both layouts are the same)
            assert _is_time_major(out) == time_major


@settings(max_examples=30, deadline=None)
@given(
    channels=st.integers(1, 8),
    frames=st.integers(1, 50),
    time_major=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 1000),
)
def test_conv_plus_residual_is_the_conv_then_the_sum_bit_for_bit(
    channels: int, frames: int, time_major: bool, dtype: torch.dtype, seed: int
) -> None:
    """``forward_plus`` (the sum fused into the kernel on CPU in float32) == conv, then add."""
    torch.manual_seed(seed)
    conv = CausalConv1d(channels, channels, 1).to(dtype).eval()
    x = _input(2, channels, frames, time_major, seed).to(dtype)
    residual = _input(2, channels, frames, not time_major, seed + 1).to(dtype)
    with torch.inference_mode():
        got, want = conv.forward_plus(x, residual), conv(x) + residual
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="kernel-1"):
        CausalConv1d(channels, channels, 3).forward_plus(x, residual)
