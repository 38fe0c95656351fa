"""The compiled SnakeBeta (tts_common.kernels.snake): torch's float32 formula within its sine's
few ulps, for every input range (the double-precision reduction past LIMIT), both layouts, windows
of longer buffers, bf16 rounded as torch rounds, and one function of each value and its channel
(a row never depends on its batch)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.decoder import snake_tolerance
from tts_common.kernels.gemv import gemv_available
from tts_common.kernels.snake import snake_beta
from tts_common.kernels.snake_source import LIMIT

pytestmark = pytest.mark.skipif(not gemv_available(), reason="no compiled kernel library on this machine")


def formula(x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """torch's float32 SnakeBeta (decoder_service's autograd path), rounded to ``x``'s dtype."""
    xf = x.float()
    return (xf + inv_beta[None, :, None] * torch.sin(xf * alpha[None, :, None]) ** 2).to(x.dtype)


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, channels, frames = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 70))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0, 3e3, 1e5]))  # 1e5 * alpha: past LIMIT
    x = torch.randn(batch, channels, frames, generator=gen) * scale
    alpha = torch.randn(channels, generator=gen).exp()
    inv_beta = 1.0 / (torch.randn(channels, generator=gen).exp() + 1e-9)
    return x, alpha, inv_beta


@settings(max_examples=60, deadline=None)
@given(cases())
def test_float32_is_the_formula_within_the_sine_s_ulps(case: tuple[torch.Tensor, ...]) -> None:
    x, alpha, inv_beta = case
    with torch.inference_mode():
        got, want = snake_beta(x, alpha, inv_beta), formula(x, alpha, inv_beta)
    assert got is not None and got.dtype == torch.float32
    assert ((got - want).abs() <= snake_tolerance(want, inv_beta)).all()


@settings(max_examples=40, deadline=None)
@given(cases())
def test_bfloat16_is_the_float32_result_rounded_as_torch_rounds(case: tuple[torch.Tensor, ...]) -> None:
    x, alpha, inv_beta = case
    xb = x.bfloat16()
    with torch.inference_mode():
        got, wide = snake_beta(xb, alpha, inv_beta), snake_beta(xb.float(), alpha, inv_beta)
    assert got is not None and wide is not None and got.dtype == torch.bfloat16
    assert torch.equal(got, wide.bfloat16())


@settings(max_examples=40, deadline=None)
@given(cases(), st.booleans(), st.integers(0, 5))
def test_layouts_windows_and_batches_give_the_same_bits(
    case: tuple[torch.Tensor, ...], time_major: bool, pad: int
) -> None:
    x, alpha, inv_beta = case
    batch, channels, frames = x.shape
    with torch.inference_mode():
        want = snake_beta(x, alpha, inv_beta)
        assert want is not None
        # time-major input (each step's channels contiguous)
        tm = x.transpose(1, 2).contiguous().transpose(1, 2) if time_major else x
        got = snake_beta(tm, alpha, inv_beta)
        assert got is not None and got.stride() == tm.stride() and torch.equal(got, want)
        # written into a window of a longer buffer (the decoder's left-context buffers)
        if time_major:
            buffer = torch.full((batch, frames + pad, channels), float("nan")).transpose(1, 2)
        else:
            buffer = torch.full((batch, channels, frames + pad), float("nan"))
        window = buffer[:, :, pad:]
        assert snake_beta(tm, alpha, inv_beta, out=window) is window
        assert torch.equal(window, want) and buffer[:, :, :pad].isnan().all()
        # each batch item alone
        for b in range(batch):
            alone = snake_beta(x[b : b + 1].clone(), alpha, inv_beta)
            assert alone is not None and torch.equal(alone, want[b : b + 1])


def test_edge_values_follow_torch() -> None:
    x = torch.tensor(
        [[[0.0, -0.0, 1e-30, LIMIT, -LIMIT * 1.5, 1e12, float("inf"), float("-inf"), float("nan")]]]
    )
    one = torch.ones(1)
    with torch.inference_mode():
        got, want = snake_beta(x, one, one), formula(x, one, one)
    assert got is not None
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    assert ((got - want).abs()[finite] <= snake_tolerance(want, one)[finite]).all()


def test_what_it_cannot_run_is_left_to_torch() -> None:
    alpha, inv_beta = torch.ones(4), torch.ones(4)
    x = torch.randn(2, 4, 10)
    with torch.inference_mode():
        assert snake_beta(x.half(), alpha, inv_beta) is None
        assert snake_beta(x[:, :, ::2], alpha, inv_beta) is None  # not dense
        assert snake_beta(x, alpha, inv_beta, out=torch.empty(2, 4, 10, dtype=torch.bfloat16)) is None
        assert snake_beta(x[0], alpha, inv_beta) is None  # not [B, C, T]
        assert snake_beta(x, alpha, inv_beta, out=x) is None  # in place
    assert snake_beta(x.requires_grad_(), alpha, inv_beta) is None  # autograd keeps torch's graph
