"""Sampling set-up off the host-sync path and greedy batches without sampling kernels:
``SamplingTensors.stack`` (one host table, one copy) equals the per-field tensors, and choosing
tokens with no noise (the all-greedy static choice) is bit-identical to the sampling kernels on
greedy rows."""

from __future__ import annotations

from dataclasses import fields

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.model.sampling import SamplingTensors, choose_tokens
from tts_common.synthesis import SamplingParams

_params = st.builds(
    SamplingParams,
    do_sample=st.booleans(),
    temperature=st.floats(0.01, 5.0),
    top_k=st.integers(0, 5000),
    top_p=st.floats(0.01, 1.0),
    repetition_penalty=st.floats(0.5, 3.0),
    subtalker_do_sample=st.booleans(),
    subtalker_temperature=st.floats(0.01, 5.0),
    subtalker_top_k=st.integers(0, 5000),
    subtalker_top_p=st.floats(0.01, 1.0),
    seed=st.none() | st.integers(0, 2**31),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_params, min_size=1, max_size=6))
def test_stack_equals_the_per_field_tensors(params: list[SamplingParams]) -> None:
    stacked = SamplingTensors.stack(params, "cpu")
    dtypes = {bool: torch.bool, int: torch.int64, float: torch.float32}
    for f in fields(SamplingTensors):
        kind = type(getattr(SamplingParams(), f.name))
        want = torch.tensor([getattr(p, f.name) for p in params], dtype=dtypes[kind])
        got = getattr(stacked, f.name)
        assert got.dtype == want.dtype and torch.equal(got, want), f.name


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(2, 300),
    seed=st.integers(0, 2**31),
    top_k=st.integers(0, 400),
    top_p=st.floats(0.05, 1.0),
)
def test_greedy_rows_skip_the_sampling_kernels_bit_identically(
    rows: int, vocab: int, seed: int, top_k: int, top_p: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[:, : vocab // 3] = logits[:, : vocab // 3].round()  # ties
    noise = -torch.log(torch.empty(rows, vocab).exponential_(generator=gen))
    greedy = torch.zeros(rows, dtype=torch.bool)
    args = (torch.full((rows,), 0.9), torch.full((rows,), top_k), torch.full((rows,), top_p))
    with_kernels = choose_tokens(logits, greedy, *args, noise)
    without = choose_tokens(logits, greedy, *args, None)
    assert torch.equal(with_kernels, without)
