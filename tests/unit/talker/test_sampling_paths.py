"""The CPU fast path of the sampling warp (``topk`` of the batch's largest k, top-p skipped when
no row uses it, no greedy argmax when every row samples) gives the same scores and tokens, bit for
bit, as the static-shape path CUDA graphs run; a choice prepared once serves every call."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.model.sampling import TokenChoice, choose_tokens, warp_for_sampling


@st.composite
def warp_inputs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = draw(st.integers(1, 6))
    vocab = draw(st.integers(2, 300))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    # Few distinct values, so ties at the k-th score are common (HF keeps every tie).
    levels = draw(st.integers(2, 40))
    logits = torch.randint(0, levels, (rows, vocab), generator=g).float() / 3 - 5
    temperature = torch.tensor(draw(st.lists(st.floats(0.05, 2.0), min_size=rows, max_size=rows)))
    top_k = torch.tensor(draw(st.lists(st.integers(0, vocab + 5), min_size=rows, max_size=rows)))
    p_values = st.one_of(st.just(1.0), st.floats(0.01, 1.0))
    top_p = torch.tensor(draw(st.lists(p_values, min_size=rows, max_size=rows)), dtype=torch.float32)
    return logits, temperature, top_k, top_p


@settings(max_examples=300, deadline=None)
@given(warp_inputs())
def test_cpu_fast_path_equals_the_static_shape_path(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    logits, temperature, top_k, top_p = inputs
    static = warp_for_sampling(logits, temperature, top_k, top_p, static_shapes=True)
    fast = warp_for_sampling(logits, temperature, top_k, top_p, static_shapes=False)
    assert torch.equal(fast, static)


def test_cpu_defaults_to_the_fast_path_and_skips_an_unused_top_p() -> None:
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    args = (logits, torch.ones(2), torch.full((2,), 5), torch.ones(2))
    assert torch.equal(warp_for_sampling(*args), warp_for_sampling(*args, static_shapes=True))
    kept = torch.isfinite(warp_for_sampling(*args)).sum(dim=-1)
    assert kept.tolist() == [5, 5]


@settings(max_examples=300, deadline=None)
@given(warp_inputs(), st.integers(0, 2**31 - 1), st.sampled_from(["all", "none", "mixed"]), st.integers(1, 4))
def test_a_choice_prepared_once_picks_the_static_paths_tokens(
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    seed: int,
    sampling: str,
    calls: int,
) -> None:
    logits, temperature, top_k, top_p = inputs
    rows, vocab = logits.shape
    g = torch.Generator().manual_seed(seed)
    do_sample = {
        "all": torch.ones(rows, dtype=torch.bool),
        "none": torch.zeros(rows, dtype=torch.bool),
        "mixed": torch.rand(rows, generator=g) < 0.5,
    }[sampling]
    fast = TokenChoice.prepare(temperature, top_k, top_p, vocab, do_sample, static_shapes=False)
    static = TokenChoice.prepare(temperature, top_k, top_p, vocab, do_sample, static_shapes=True)
    assert (fast.do_sample is None) == bool(do_sample.all())  # the all-sampling shortcut, CPU only
    for _ in range(calls):  # one preparation, several calls (the code predictor's 15 per step)
        step_logits = logits + torch.randint(0, 3, logits.shape, generator=g).float() / 3
        noise = -torch.log(-torch.log(torch.rand(rows, vocab, generator=g).clamp_min(1e-9)))
        tokens = fast.choose(step_logits, noise)
        assert torch.equal(tokens, static.choose(step_logits, noise))
        assert torch.equal(tokens, choose_tokens(step_logits, do_sample, temperature, top_k, top_p, noise))
        greedy = step_logits.argmax(dim=-1)
        assert torch.equal(tokens[~do_sample], greedy[~do_sample])
