"""Pre-packed oneDNN linears: close to nn.Linear, batch-invariant to the bit, same state-dict keys."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tts_common.onednn_linear import OneDnnLinear, onednn_linear_available, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="torch built without oneDNN")

# (in, out, bias): the talker's attention/MLP shapes in miniature plus the shapes whose single
# row takes oneDNN's separate GEMV path (large in, small out).
SHAPES = [(64, 192, False), (192, 64, False), (3072, 1024, False), (2048, 512, True), (96, 7, True)]


@pytest.mark.parametrize(("fan_in", "fan_out", "bias"), SHAPES)
def test_matches_nn_linear(fan_in: int, fan_out: int, bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(fan_in, fan_out, bias=bias)
    x = torch.randn(5, 3, fan_in)
    with torch.inference_mode():
        want = linear(x)
        got = OneDnnLinear(linear)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize(("fan_in", "fan_out", "bias"), SHAPES)
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(fan_in: int, fan_out: int, bias: bool) -> None:
    torch.manual_seed(1)
    layer = OneDnnLinear(nn.Linear(fan_in, fan_out, bias=bias))
    x = torch.randn(40, fan_in)
    with torch.inference_mode():
        full = layer(x)
        for rows in (1, 2, 3, 16, 17):
            assert torch.equal(layer(x[:rows]), full[:rows]), rows
        alone = torch.cat([layer(x[i]).unsqueeze(0) for i in range(0, 40, 7)])
        assert torch.equal(alone, full[0:40:7])
        # [B, S, in] inputs and a strided single row (the decode step's h[:, -1]).
        assert torch.equal(layer(x.view(8, 5, fan_in)).reshape(40, fan_out), full)
        assert torch.equal(layer(x.view(8, 5, fan_in)[:1, -1]), full[4:5])


def test_conversion_keeps_state_dict_keys_and_skips_other_dtypes() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ModuleList([nn.Linear(8, 8, bias=False), nn.LayerNorm(8)]))
    keys = list(model.state_dict())
    assert use_onednn_linears(model) == 2
    assert list(model.state_dict()) == keys
    assert isinstance(model[0], OneDnnLinear) and isinstance(model[1][0], OneDnnLinear)
    assert isinstance(model[1][1], nn.LayerNorm)

    half = nn.Sequential(nn.Linear(4, 4)).to(torch.bfloat16)
    assert use_onednn_linears(half) == 0
    assert type(half[0]) is nn.Linear


def test_bf16_is_available_only_where_onednn_runs_it_on_this_cpu(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """oneDNN's bf16 packing raises on CPUs without AVX512-BW/VL/DQ or AVX-NE-CONVERT (an
    AVX2-only EPYC): the kernel choice must then leave ``onednn-bf16`` out, not fail to start."""
    from tts_common.kernels.candidates import candidate_available
    from tts_common.kernels.choice import time_kernels

    real = torch.ops.mkldnn._reorder_linear_weight

    def reorder(weight: torch.Tensor, *args: object) -> torch.Tensor:
        if weight.dtype == torch.bfloat16:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support ...")
        return real(weight, *args)

    class Ops:
        def __getattr__(self, name: str) -> object:
            return reorder if name == "_reorder_linear_weight" else getattr(torch.ops.mkldnn, name)

    monkeypatch.setattr(torch.ops, "mkldnn", Ops(), raising=False)
    onednn_linear_available.cache_clear()
    try:
        assert onednn_linear_available(torch.float32) and not onednn_linear_available(torch.bfloat16)
        assert candidate_available("onednn-fp32") and not candidate_available("onednn-bf16")
        timed = time_kernels(["torch-bf16", "onednn-bf16"], (32, 16, False), [1, 2], repeat=1)
        assert set(timed) == {"torch-bf16"}
    finally:
        monkeypatch.undo()
        onednn_linear_available.cache_clear()
