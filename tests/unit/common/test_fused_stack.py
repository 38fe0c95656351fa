"""The fused decoder-stack forward (tts_common.kernels.fused_stack): close to the torch path with
the same packed GEMV kernels (hidden states and every K/V written; int8 with float32 or
bfloat16 activations, gemv-bf16, gemv-bf16dp, gemv-int8dp, and the AMX kernels where the CPU has
them), a row's outputs and cache writes bit-identical
whatever rows share its call, set up only where every linear is one of our packed GEMV kernels,
and used only for the attention layouts it computes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.model.layers import Attention, AttentionSpec, DecoderStack
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.candidates import candidate_available
from tts_common.kernels.choice import KernelTable, linear_shapes, use_kernels
from tts_common.kernels.gemv import (
    amx_bf16_available,
    amx_int8_available,
    bf16_dot_available,
    library,
    w8a8_kernel_available,
)
from tts_common.layers import GatedMLP

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        library() is None,
        reason="no C compiler, or neither AVX-512 nor AVX2 with FMA, here: the fused stack is not built",
    ),
]
FAMILIES = {
    "fp32": (torch.float32, "gemv-fp32"),
    "fp32-int8": (torch.float32, "gemv-fp32+gemv-int8"),
    "int8": (torch.float32, "gemv-int8"),
    "int8-bf16": (torch.bfloat16, "gemv-int8"),
    "bf16": (torch.bfloat16, "gemv-bf16"),
    "int8-split": (torch.float32, "gemv-int8"),
    "bf16-split": (torch.bfloat16, "gemv-bf16"),
    **(
        {"bf16dp": (torch.bfloat16, "gemv-bf16dp"), "int8dp-bf16": (torch.bfloat16, "gemv-int8dp")}
        if bf16_dot_available()
        else {}
    ),
    **(
        {
            "int8amx": (torch.float32, "gemv-int8amx"),
            "bf16amx": (torch.bfloat16, "gemv-bf16amx"),
            "int8-mixed": (torch.float32, "gemv-int8amx+gemv-int8"),
        }
        if amx_bf16_available()
        else {}
    ),
    **(
        {
            "int8x4amx": (torch.float32, "gemv-int8x4amx"),
            "int8x4amx-bf16": (torch.bfloat16, "gemv-int8x4amx"),
            "int8-mixed-x4": (torch.float32, "gemv-int8x4amx+gemv-int8"),
        }
        if amx_int8_available()
        else {}
    ),
    **(
        {
            "w8a8": (torch.float32, "gemv-w8a8"),
            "w8a8-bf16": (torch.bfloat16, "gemv-w8a8"),
            "w8a8-split": (torch.float32, "gemv-w8a8"),
        }
        if w8a8_kernel_available()
        else {}
    ),
}
"""Activation dtype and GEMV kernel of each fused configuration (int8 in a bfloat16 model too;
``a+b``: kernel a for the linears reading the hidden state (q/k/v, gate/up), b for the others,
as a per-shape choice may mix them; ``-split``: q/k/v and gate/up left unfused, one call each, as
when the choice keeps different kernels for q's and k/v's shapes)."""
TOLERANCE = {torch.float32: (1e-5, 2e-6), torch.bfloat16: (4e-2, 4e-2)}
"""(rtol, atol) of fused against the torch path (same GEMV kernels), by activation dtype.
float32: sums in another order and a ~1 ulp exp per operation, over up to 3 layers (measured
at most 5.8e-7 of |value| + 1 over 300 examples). bfloat16: both round at the same points, so
values are mostly bit-identical (whole calls in 30-75% of examples); one nearer a rounding
boundary than the float32 differences lands one bf16 step (2^-8 relative) apart and carries that
into later layers (measured at most 2.0e-2 of |value| + 1, the AMX kernel included)."""


@pytest.fixture(autouse=True, scope="module")
def kernel_cache(tmp_path_factory):  # type: ignore[no-untyped-def]
    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("kcache")))
    yield
    mp.undo()


_STACKS: dict[tuple, DecoderStack] = {}


def _stack(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, bias: bool, family: str
) -> DecoderStack:
    """A random stack with one of our packed GEMV kernels throughout, as the engine sets them up
    (cached per config: building one packs its weights)."""
    key = (layers, hidden, heads, kv_heads, head_dim, inter, bias, family)
    if key not in _STACKS:
        dtype, kernel = FAMILIES[family]
        torch.manual_seed(hash(key[:-1]) % 2**31)
        stack = DecoderStack(layers, hidden, inter, heads, kv_heads, head_dim, 1e-6, 10000.0, bias)
        with torch.no_grad():
            for p in stack.parameters():
                p.normal_(0.0, 0.3)
        stack = stack.to(dtype)
        from_hidden, others = (kernel.split("+") * 2)[:2]
        table = KernelTable(
            "w8a8"
            if "w8a8" in kernel
            else "int8"
            if "int8" in kernel
            else "float32"
            if dtype == torch.float32
            else "bfloat16",
            (1,),
        )
        table.chosen = {
            shape: from_hidden if shape[0] == hidden else others for shape in linear_shapes(stack)
        }
        with pytest.MonkeyPatch.context() as mp:
            if family.endswith("-split"):
                mp.setattr(Attention, "FUSED_PROJECTIONS", {})
                mp.setattr(GatedMLP, "FUSED_PROJECTIONS", {})
            use_kernels(stack, table)
        assert stack.fused_stack is not None
        assert stack.fused_stack.kernel == "+".join(sorted(set(table.chosen.values())))
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
    """A stack (its dimensions and :data:`FAMILIES` entry) and one call: rows, tokens per row (1,
    or 2 in causal order), positions, the slot mapping (int, None, tensor), and the cache."""
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
    family = draw(st.sampled_from(sorted(FAMILIES)))
    cfg = (layers, hidden, heads, kv, head_dim, inter, bias, family)
    return cfg, rows, s, slots, positions, num_slots, max_len, seed


def _inputs(cfg: tuple, rows: int, s: int, num_slots: int, max_len: int, seed: int):  # type: ignore[no-untyped-def]
    layers, hidden, _, kv, head_dim, _, _, family = cfg
    dtype = FAMILIES[family][0]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, s, hidden, generator=g)
    k = torch.randn(layers, num_slots, kv, max_len, head_dim, generator=g)
    return x.to(dtype), k.to(dtype), torch.randn(k.shape, generator=g).to(dtype)


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
    # w8a8 quantizes each activation: a last-bit difference that moves one across half a step
    # moves it a whole step, a bf16-sized change (loose, as bfloat16's).
    rtol, atol = TOLERANCE[torch.bfloat16 if "w8a8" in cfg[-1] else x.dtype]
    assert got.dtype == want.dtype and got_k.dtype == want_k.dtype
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    # Every K/V written where the torch path writes it (and nothing else touched).
    torch.testing.assert_close(got_k, want_k, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_v, want_v, rtol=rtol, atol=atol)
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


def test_only_stacks_of_one_packed_gemv_get_a_fused_forward() -> None:
    cases = [
        (torch.float32, "float32", "onednn-fp32"),
        (torch.float32, "float32", "torch-fp32"),
        (torch.float32, "int8", "torch-int8"),
        (torch.bfloat16, "bfloat16", "onednn-bf16"),
        (torch.bfloat16, "bfloat16", "gemvrow-bf16dp"),  # our dot product, not packed
        (torch.float32, "bfloat16", "gemv-bf16"),  # bf16 weights in a float32 model
        (torch.float32, "int8", "gemv-int8dp"),  # it would round a float32 model's activations
    ]
    for dtype, family, kernel in cases:
        if not candidate_available(kernel):
            continue
        stack = DecoderStack(2, 32, 32, 2, 1, 16, 1e-6, 10000.0).to(dtype)
        table = KernelTable(family, (1,))
        table.chosen = dict.fromkeys(linear_shapes(stack), kernel)
        use_kernels(stack, table)
        assert stack.fused_stack is None, (dtype, kernel)
    # One layer's MLP on another kernel: the whole stack stays on the torch path.
    stack = DecoderStack(2, 32, 32, 2, 1, 16, 1e-6, 10000.0)
    table = KernelTable("int8", (1,))
    table.chosen = dict.fromkeys(linear_shapes(stack), "gemv-int8")
    stack.layers[1].mlp.down_proj = torch.nn.Identity()  # not an nn.Linear: left as it is
    use_kernels(stack, table)
    assert stack.fused_stack is None


def test_a_stack_of_library_kernels_never_builds_our_library(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A model on library kernels only (--linear onednn or torch) must not compile C at start: a
    # container's cache volume, a missing compiler or a read-only cache is then never in its way.
    from tts_common.kernels import fused_stack

    def refuse() -> None:
        raise AssertionError("the library was built for a stack it cannot fuse")

    monkeypatch.setattr(fused_stack, "library", refuse)
    stack = DecoderStack(2, 32, 32, 2, 1, 16, 1e-6, 10000.0)
    table = KernelTable("float32", (1,))
    table.chosen = dict.fromkeys(linear_shapes(stack), "torch-fp32")
    use_kernels(stack, table)
    assert stack.fused_stack is None


def test_the_fused_forward_runs_only_for_prefix_attention_in_its_dtype(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stack = _stack(1, 32, 2, 1, 16, 32, False, "int8")
    assert stack.fused_stack is not None
    calls: list[int] = []
    forward = stack.fused_stack.forward
    monkeypatch.setattr(stack.fused_stack, "forward", lambda *a: calls.append(1) or forward(*a))
    x, k, v = _inputs((1, 32, 2, 1, 16, 32, False, "int8"), 2, 1, 2, 8, 0)
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
    stack = _stack(1, 32, 2, 1, 16, 32, False, "int8")
    x, k, v = _inputs((1, 32, 2, 1, 16, 32, False, "int8"), 1, 1, 1, 8, 0)
    fused = stack.fused_stack
    assert fused is not None
    cos = sin = torch.ones(1, 1, 16)
    for positions, slots in ((torch.tensor([[8]]), 0), (torch.tensor([[-1]]), 0), (torch.tensor([[2]]), 1)):
        before = k.clone()
        with pytest.raises(ValueError, match="outside the cache"):
            fused.forward(x, cos, sin, k, v, positions, slots)
        assert torch.equal(k, before)
