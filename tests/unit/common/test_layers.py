"""The shared transformer layers keep the reference numerics in every activation dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_common.layers import ACTIVATIONS, GatedMLP, RMSNorm, RotaryEmbedding, apply_rope

DTYPES = [torch.float32, torch.bfloat16]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dim=st.sampled_from([4, 16, 128]), dtype=st.sampled_from(DTYPES))
def test_rms_norm_normalizes_in_float32_and_casts_back_before_the_weight(
    seed: int, dim: int, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(3, dim, generator=g) * 10).to(dtype)
    norm = RMSNorm(dim, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
    h = x.to(torch.float32)
    want = norm.weight * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    got = norm(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    positions=st.lists(st.integers(0, 40_000), min_size=1, max_size=8),
    head_dim=st.sampled_from([8, 64, 128]),
    dtype=st.sampled_from(DTYPES),
)
def test_rope_tables_are_float32_angles_cast_to_the_activation_dtype(
    positions: list[int], head_dim: int, dtype: torch.dtype
) -> None:
    rope = RotaryEmbedding(head_dim, 1_000_000.0).to(dtype)  # a cast must not round the frequencies
    pos = torch.tensor([positions])
    cos, sin = rope(pos, dtype)
    inv_freq = 1.0 / (1_000_000.0 ** (torch.arange(0, head_dim, 2).to(torch.float64) / head_dim))
    angles = pos.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    assert cos.dtype == sin.dtype == dtype
    # fp32 angles of positions up to 40k: about 40k * 2^-24 rad of rounding before the cast
    tol = 5e-3 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=tol)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=tol)
    assert rope.inv_freq(torch.device("cpu")).dtype == torch.float32
    assert not list(rope.state_dict())


def test_rope_rotates_each_half_pair_by_its_angle() -> None:
    x = torch.randn(1, 2, 3, 8)
    cos, sin = RotaryEmbedding(8, 10_000.0)(torch.tensor([[0, 5, 9]]), torch.float32)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[:, :, 0], x[:, :, 0])  # position 0 is the identity
    # a rotation keeps the norm of each (i, i + half) pair
    pairs = lambda t: t[..., :4] ** 2 + t[..., 4:] ** 2  # noqa: E731 - a local shorthand
    torch.testing.assert_close(pairs(out), pairs(x))


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_gated_mlp_is_down_of_act_gate_times_up(act: str) -> None:
    torch.manual_seed(0)
    mlp = GatedMLP(6, 10, act)
    x = torch.randn(2, 6)
    want = mlp.down_proj(ACTIVATIONS[act](mlp.gate_proj(x)) * mlp.up_proj(x))
    assert torch.equal(mlp(x), want)
    assert sorted(mlp.state_dict()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
