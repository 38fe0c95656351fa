"""The talker's decode step with the fused decoder stacks (our packed GEMV throughout: int8, w8a8,
or bf16 in a bfloat16 model; tts_common.kernels.fused_stack) against the same step on the torch
path with the same kernels: the talker's masked decode and the code predictor's causal prefill
and one-token steps all run fused, and the step's hidden state, K/V and codes agree."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from talker_service.model import TalkerModel
from talker_service.model.sampling import SamplingTensors
from talker_service.model.step import DecodeState, decode_step, prefill
from tests.helpers.fixtures import CKPT_DIR, fixture_prompt_inputs, load_requests
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.choice import set_up_linears
from tts_common.kernels.gemv import gemv_available, w8a8_kernel_available
from tts_common.synthesis import SamplingParams

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not gemv_available(), reason="no C compiler or no AVX-512 here: no GEMV, no fused stack"
    ),
]
NAME = "tiny_custom_voice_1b7"  # a talker wider than its code predictor: the projection runs too
TOLERANCE = {"float32": (1e-5, 2e-6), "bfloat16": (4e-2, 4e-2)}
"""(rtol, atol) as the stack's own test (tests/unit/common/test_fused_stack.py): summation order
and exp, and in bfloat16 a value near a rounding boundary one bf16 step apart."""


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))


@pytest.mark.parametrize(
    ("dtype", "quantization"),
    [
        ("float32", "int8"),
        ("bfloat16", "none"),
        pytest.param(
            "float32",
            "w8a8",
            marks=pytest.mark.skipif(not w8a8_kernel_available(), reason="no w8a8 GEMV here"),
        ),
    ],
)
def test_a_fused_decode_step_matches_the_torch_path_with_the_same_kernels(
    monkeypatch,  # type: ignore[no-untyped-def]
    dtype: str,
    quantization: str,
) -> None:
    m = TalkerModel.from_checkpoint(CKPT_DIR / NAME, dtype=getattr(torch, dtype))
    set_up_linears(m.talker, m.device, m.dtype, "gemv", quantization, (1, 2))
    # w8a8: an activation a last bit moves across half a step moves a whole step (as bfloat16's)
    rtol, atol = TOLERANCE["bfloat16" if quantization == "w8a8" else dtype]
    stacks = [m.talker.model, m.talker.code_predictor.model]
    fused = [s.fused_stack for s in stacks]
    assert all(f is not None for f in fused)
    calls = [0, 0]
    for i, f in enumerate(fused):
        forward = f.forward

        def counted(*args, _forward=forward, _index=i):  # type: ignore[no-untyped-def]
            calls[_index] += 1
            return _forward(*args)

        monkeypatch.setattr(f, "forward", counted)
    prompts = [m.build_prompt(fixture_prompt_inputs(NAME, line)) for line in load_requests(NAME)[:2]]
    params = SamplingTensors.stack([SamplingParams.greedy()], m.device)
    cache = m.allocate_cache(2, 128)
    state = DecodeState.cat(
        [prefill(m.talker, cache, slot, p.prefill, params) for slot, p in enumerate(prompts)]
    )
    trailing = torch.stack([p.trailing_row(0) for p in prompts])
    attend = int(state.positions.max()) + 1

    def step(use_fused: bool):  # type: ignore[no-untyped-def]
        run_cache = dataclasses.replace(
            cache, k=cache.k.clone(), v=cache.v.clone(), lengths=cache.lengths.clone()
        )
        run_state = state.rows(torch.arange(2))
        for s, f in zip(stacks, fused):
            s.fused_stack = f if use_fused else None
        try:
            out = decode_step(m.talker, run_cache, run_state, trailing, attend)
        finally:
            for s, f in zip(stacks, fused):
                s.fused_stack = f
        return out, run_state, run_cache

    want, want_state, want_cache = step(False)
    assert calls == [0, 0]
    got, got_state, got_cache = step(True)
    # The talker once; the code predictor's prefill and its 14 single steps.
    assert calls == [1, m.talker.code_predictor.num_groups - 1]
    assert torch.equal(got.frame_codes, want.frame_codes) and torch.equal(got.next_code0, want.next_code0)
    torch.testing.assert_close(got_state.past_hidden, want_state.past_hidden, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_cache.k, want_cache.k, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_cache.v, want_cache.v, rtol=rtol, atol=atol)
    assert not torch.equal(got_cache.k, cache.k)
