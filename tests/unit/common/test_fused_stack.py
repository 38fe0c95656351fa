"""The fused decoder-stack forward (tts_common.kernels.fused_stack): close to the torch path with
the same int8 GEMV kernels (hidden states and every K/V written), a row's outputs and cache
writes bit-identical whatever rows share its call, set up only where every linear is our packed
int8 GEMV, and used only for the attention layouts it computes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.model.layers import AttentionSpec, DecoderStack
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.choice import set_up_linears
from tts_common.kernels.gemv import library

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        library() is None, reason="no C compiler or no AVX-512 here: the fused stack is not built"
    ),
]
RTOL, ATOL = 1e-5, 2e-6
"""Fused against the torch path (same GEMV kernels): sums in another order and a ~1 ulp exp per
operation, over up to 3 layers (measured at most 5.4e-7 of |value| + 1 over 200 examples)."""


@pytest.fixture(autouse=True, scope="module")
def kernel_cache(tmp_path_factory):  # type: ignore[no-untyped-def]
    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("kcache")))
    yield
    mp.undo()


_STACKS: dict[tuple, DecoderStack] = {}


def _stack(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, bias: bool
) -> DecoderStack:
    """A random stack with the engine's int8 GEMV kernels (cached per config: building one packs
    its weights)."""
    key = (layers, hidden, heads, kv_heads, head_dim, inter, bias)
    if key not in _STACKS:
        torch.manual_seed(hash(key) % 2**31)
        stack = DecoderStack(layers, hidden, inter, heads, kv_heads, head_dim, 1e-6, 10000.0, bias)
        with torch.no_grad():
            for p in stack.parameters():
                p.normal_(0.0, 0.3)
        set_up_linears(stack, "cpu", torch.float32, "gemv", "int8", (1, 2))
        assert stack.fused_stack is not None
        _STACKS[key] = stack
    return _STACKS[key]


configs = st.tuples(
    st.integers(1, 3),  # layers
    st.integers(1, 4).map(lambda n: 16 * n),  # hidden
    st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4), (6, 2)]),  # heads, kv heads
    st.sampled_from([16, 32, 64]),  # head_dim (a q/k/v width in whole groups of 16)
    st.integers(1, 6).map(lambda n: 16 * n),  # intermediate
    st.booleans(),  # attention bias
)


@st.composite
def calls(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    """A stack and one call: rows, tokens per row (1, or 2 in causal order), positions, the slot
    mapping (int, None, tensor), and the cache."""
    layers, hidden, (heads, kv), head_dim, inter, bias = draw(configs)
    rows = draw(st.integers(1, 8))
    s = draw(st.sampled_from([1, 2]))
    kind = draw(st.sampled_from(["int", "none", "tensor"]))
    num_slots = rows + draw(st.integers(0, 3))
    max_len = draw(st.integers(s, 80))
    if kind == "tensor":
        slots: int | torch.Tensor | None = torch.tensor(draw(st.permutations(range(num_slots)))[:rows])
    elif kind == "int":
        slots = draw(st.integers(0, num_slots - rows))
    else:
        slots = None
    firsts = [draw(st.integers(0, max_len - s)) for _ in range(rows)]
    positions = torch.tensor([[p + i for i in range(s)] for p in firsts])
    seed = draw(st.integers(0, 2**16))
    return (
        (layers, hidden, heads, kv, head_dim, inter, bias),
        rows,
        s,
        slots,
        positions,
        num_slots,
        max_len,
        seed,
    )


def _inputs(cfg: tuple, rows: int, s: int, num_slots: int, max_len: int, seed: int):  # type: ignore[no-untyped-def]
    layers, hidden, _, kv, head_dim, _, _ = cfg
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, s, hidden, generator=g)
    k = torch.randn(layers, num_slots, kv, max_len, head_dim, generator=g)
    return x, k, torch.randn(k.shape, generator=g)


def _spec(positions: torch.Tensor, slots: int | torch.Tensor | None) -> AttentionSpec:
    """What the talker's masked decode and the code predictor pass: a causal prefill of positions
    0..S-1 (SDPA's causal mode), else a mask of keys up to each token's position."""
    s = positions.shape[1]
    if s == 2 and bool((positions == torch.arange(2)).all()):
        return AttentionSpec(positions, slots, 2, None, True, prefix_only=True)
    attend = int(positions.max()) + 1
    mask = (torch.arange(attend)[None, None, :] <= positions[:, :, None]).unsqueeze(1)
    return AttentionSpec(positions, slots, attend, mask, False, prefix_only=True)


def _run(stack: DecoderStack, x, k, v, spec: AttentionSpec, fused: bool):  # type: ignore[no-untyped-def]
    k, v = k.clone(), v.clone()
    saved = stack.fused_stack
    if not fused:
        stack.fused_stack = None
    try:
        with torch.inference_mode():
            out = stack.run_layers(x, k, v, spec)
    finally:
        stack.fused_stack = saved
    return out, k, v


@settings(max_examples=60, deadline=None)
@given(call=calls())
def test_fused_stack_matches_the_torch_path_with_the_same_kernels(call) -> None:  # type: ignore[no-untyped-def]
    cfg, rows, s, slots, positions, num_slots, max_len, seed = call
    stack = _stack(*cfg)
    x, k, v = _inputs(cfg, rows, s, num_slots, max_len, seed)
    spec = _spec(positions, slots)
    got, got_k, got_v = _run(stack, x, k, v, spec, fused=True)
    want, want_k, want_v = _run(stack, x, k, v, spec, fused=False)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    # Every K/V written where the torch path writes it (and nothing else touched).
    torch.testing.assert_close(got_k, want_k, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(got_v, want_v, rtol=RTOL, atol=ATOL)
    assert not torch.equal(got_k, k) and not torch.equal(got_v, v)


@settings(max_examples=30, deadline=None)
@given(call=calls(), threads=st.sampled_from([1, 2]))
def test_a_rows_outputs_and_cache_writes_do_not_depend_on_its_batch(call, threads: int) -> None:  # type: ignore[no-untyped-def]
    """Each row alone (in its own slot) against the whole call, to the bit, on one thread or
    sharing attention and GEMV work with a worker."""
    cfg, rows, s, slots, positions, num_slots, max_len, seed = call
    stack = _stack(*cfg)
    x, k, v = _inputs(cfg, rows, s, num_slots, max_len, seed)
    if isinstance(slots, torch.Tensor):
        slot_of = slots.tolist()
    else:
        slot_of = [(0 if slots is None else slots) + r for r in range(rows)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together, k_all, v_all = _run(stack, x, k, v, _spec(positions, slots), fused=True)
        for r in range(rows):
            alone, k_one, v_one = _run(
                stack, x[r : r + 1], k, v, _spec(positions[r : r + 1], torch.tensor([slot_of[r]])), fused=True
            )
            assert torch.equal(alone[0], together[r]), r
            assert torch.equal(k_one[:, slot_of[r]], k_all[:, slot_of[r]]), r
            assert torch.equal(v_one[:, slot_of[r]], v_all[:, slot_of[r]]), r
    finally:
        torch.set_num_threads(previous)


def test_only_stacks_of_packed_int8_gemv_get_a_fused_forward() -> None:
    for dtype, linear, quantization in [
        (torch.float32, "auto", "none"),
        (torch.bfloat16, "gemv", "none"),
        (torch.float32, "torch", "int8"),
    ]:
        stack = DecoderStack(1, 32, 32, 2, 1, 16, 1e-6, 10000.0).to(dtype)
        set_up_linears(stack, "cpu", dtype, linear, quantization, (1,))
        assert stack.fused_stack is None, (dtype, linear, quantization)


def test_the_fused_forward_runs_only_for_prefix_attention_and_float32(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stack = _stack(1, 32, 2, 1, 16, 32, False)
    assert stack.fused_stack is not None
    calls: list[int] = []
    forward = stack.fused_stack.forward
    monkeypatch.setattr(stack.fused_stack, "forward", lambda *a: calls.append(1) or forward(*a))
    x, k, v = _inputs((1, 32, 2, 1, 16, 32, False), 2, 1, 2, 8, 0)
    positions = torch.tensor([[3], [5]])
    spec = _spec(positions, None)
    _run(stack, x, k, v, spec, fused=True)
    assert calls == [1]
    spec.prefix_only = False  # e.g. packed prompts' per-prompt attention, or in-place attention
    _run(stack, x, k, v, spec, fused=True)
    assert calls == [1]
    fused = stack.fused_stack
    assert fused.accepts(x, k, v)
    assert not fused.accepts(x.bfloat16(), k.bfloat16(), v.bfloat16())  # activations it does not take
    wider = torch.cat([k, v], dim=3)
    assert not fused.accepts(x, wider[..., : k.shape[3], :], wider[..., k.shape[3] :, :])  # not contiguous
    assert not fused.accepts(x, k[:, :, :, :, :8], v[:, :, :, :, :8])  # another head_dim


def test_a_position_outside_the_cache_is_an_error_not_a_write() -> None:
    stack = _stack(1, 32, 2, 1, 16, 32, False)
    x, k, v = _inputs((1, 32, 2, 1, 16, 32, False), 1, 1, 1, 8, 0)
    fused = stack.fused_stack
    assert fused is not None
    cos = sin = torch.ones(1, 1, 16)
    for positions, slots in ((torch.tensor([[8]]), 0), (torch.tensor([[-1]]), 0), (torch.tensor([[2]]), 1)):
        before = k.clone()
        with pytest.raises(ValueError, match="outside the cache"):
            fused.forward(x, cos, sin, k, v, positions, slots)
        assert torch.equal(k, before)
