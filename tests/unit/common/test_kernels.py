"""The CPU linear kernels (tts_common.kernels): every candidate close to nn.Linear at its
precision and batch-invariant to the bit; our GEMV equal to its torch reference within float32
rounding; the choice kept per shape, cached, and one kernel for every bucket."""

from __future__ import annotations

import ctypes
import json
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tts_common.cpu_info import cpu_flags
from tts_common.kernels import choice
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.candidates import (
    CANDIDATES,
    FAMILIES,
    NOT_BATCH_INVARIANT,
    candidate_available,
    fuse_outputs,
    kernel_revision,
    make_candidate,
    quantize_int8,
)
from tts_common.kernels.gemv import (
    A8_MAX_IN_FEATURES,
    LIBRARY_SOURCE,
    X4_MAX_IN_FEATURES,
    amx_bf16_available,
    amx_int8_available,
    bf16_dot_available,
    compile_library,
    gemv,
    gemv_available,
    gemv_reference,
    gemv_w8a8,
    kernel_k_group,
    pack_w8a8,
    pack_weight,
    quantize_rows,
    w8a8_kernel_available,
    w8a8_reference,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NO_LIBRARY = "no C compiler, or neither AVX-512 nor AVX2 with FMA, on this machine"
"""Why the tests of our kernel library skip."""
AVAILABLE = [k for k in CANDIDATES if candidate_available(k)]
TOLERANCE = {
    "fp32": 1e-5,
    "bf16": 2e-2,
    "bf16dp": 2e-2,
    "bf16amx": 2e-2,
    "int8": 2e-2,
    "int8amx": 2e-2,
    "int8x4amx": 2e-2,
    "int8dp": 2e-2,
    "w8a8": 3e-2,
}
"""Relative tolerance against float32 nn.Linear, by the kernel's precision (w8a8: each activation
also within half a step of its row's largest / 127)."""
NO_W8A8 = "no w8a8 kernel here (no kernel library, or AVX-512 without VNNI)"


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def _linear(fan_in: int, fan_out: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(fan_in, fan_out, bias=bias)


GEMV_KINDS = [
    "fp32",
    "int8",
    "bf16",
    *(["bf16dp", "bf16dp-rows", "int8dp"] if bf16_dot_available() else []),
    *(["bf16amx", "int8amx"] if amx_bf16_available() else []),
    *(["int8x4amx"] if amx_int8_available() else []),
]
"""Our kernels: float32 / int8 / bf16 weights with float32 activations, the bf16 dot product packed and
row-wise (and with int8 weights widened to bf16), on AMX-BF16 tiles (bf16, and int8 with
float32 activations) and on AMX-INT8 tiles (int8 with the activations as int8 digits). Each is
tested only where the CPU has its instructions (and, for AMX, the OS grants the tile state):
elsewhere it cannot run and the engine never offers it."""


BF16_X_KINDS = frozenset({"bf16dp", "bf16dp-rows", "bf16amx", "int8dp"})
"""The kinds that take bf16 activations."""


def _gemv_case(kind: str, rows: int, fan_in: int, fan_out: int, bias: bool, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g)
    w = torch.randn(fan_out, fan_in, generator=g)
    weight, scale = (
        quantize_int8(w) if kind.startswith("int8") else (w, None) if kind == "fp32" else (w.bfloat16(), None)
    )
    if kind in BF16_X_KINDS:
        x = x.bfloat16()
    b = torch.randn(fan_out, generator=g) if bias else None
    return x, weight, scale, b


def _flags(kind: str) -> dict[str, bool]:
    return {"amx": kind in ("bf16amx", "int8amx"), "x_digits": kind == "int8x4amx"}


def _packed(kind: str, weight: torch.Tensor):  # type: ignore[no-untyped-def]
    if kind == "bf16dp-rows":
        return weight
    x_dtype = torch.bfloat16 if kind in BF16_X_KINDS else torch.float32
    return pack_weight(weight, kernel_k_group(x_dtype, weight.dtype, **_flags(kind)))


def _run(kind: str, x: torch.Tensor, packed, scale, b) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return gemv(x, packed, scale, b, rows_layout=kind == "bf16dp-rows", **_flags(kind))


@pytest.mark.skipif(not gemv_available(), reason=NO_LIBRARY)
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(GEMV_KINDS),
    rows=st.integers(1, 17),
    fan_in=st.integers(1, 700),
    fan_out=st.integers(1, 70),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemv_equals_its_torch_reference_and_a_row_alone(
    kind: str, rows: int, fan_in: int, fan_out: int, bias: bool, seed: int
) -> None:
    x, weight, scale, b = _gemv_case(kind, rows, fan_in, fan_out, bias, seed)
    packed = _packed(kind, weight)
    got = _run(kind, x, packed, scale, b)
    want = gemv_reference(x, weight, scale, b)
    # float32 sums of the same exact products in another order: error ~ eps * sum |x w| (rows of
    # 1..17 cover one and more passes of 8 rows and of AMX's 16-row tiles).
    bound = (
        1e-5 * (x.float().abs() @ (weight.float().abs() * (1 if scale is None else scale[:, None])).T) + 1e-6
    )
    assert (got - want).abs().le(bound).all()
    # Batch invariance: each row, alone or in any leading slice, has the same bits.
    for r in range(rows):
        assert torch.equal(_run(kind, x[r : r + 1], packed, scale, b), got[r : r + 1]), r
        assert torch.equal(_run(kind, x[: r + 1], packed, scale, b), got[: r + 1]), r


@pytest.mark.skipif(
    not amx_int8_available(), reason="no AMX-INT8 on this CPU, or the OS refused the tile state"
)
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 17),
    fan_in=st.integers(1, 300),
    fan_out=st.integers(1, 40),
    spread=st.integers(0, 40),
    special=st.sampled_from(["none", "zero", "nan", "inf"]),
    seed=st.integers(0, 2**16),
)
def test_int8_digits_kernel_is_the_exact_sum_of_its_truncated_activations(
    rows: int, fan_in: int, fan_out: int, spread: int, special: str, seed: int
) -> None:
    # gemv-int8x4amx keeps each activation to 2^-27 of its row's largest magnitude (four int8
    # digits under a power-of-two scale), sums exactly in integers and rounds three times (the
    # sum to float32, the channel's scale, the bias): rows spanning 2^±40 in magnitude, an
    # all-zero row (just the bias) and a row with a NaN or an infinity (all NaN, the others
    # untouched).
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g) * torch.exp2(
        torch.randint(-spread, spread + 1, (rows, fan_in), generator=g).float()
    )
    weight, scale = quantize_int8(torch.randn(fan_out, fan_in, generator=g))
    b = torch.randn(fan_out, generator=g)
    odd = rows // 2
    if special != "none":
        x[odd] = 0.0 if special == "zero" else x[odd]
        x[odd, fan_in // 2] = {"zero": 0.0, "nan": float("nan"), "inf": -float("inf")}[special]
    packed = pack_weight(weight, kernel_k_group(torch.float32, torch.int8, amx=False, x_digits=True))
    got = gemv(x, packed, scale, b, x_digits=True)
    w = weight.double() * scale.double()[:, None]
    exact = x.double() @ w.T + b.double()
    truncation = x.double().abs().amax(1, keepdim=True) * 2.0**-27 * w.abs().sum(1)
    rounding = 2.0**-22 * ((exact - b.double()).abs() + exact.abs())
    finite = [r for r in range(rows) if not (special in ("nan", "inf") and r == odd)]
    assert (got[finite].double() - exact[finite]).abs().le(truncation[finite] + rounding[finite]).all()
    if special in ("nan", "inf"):
        assert got[odd].isnan().all()
    if special == "zero":
        assert torch.equal(got[odd], b)
    for r in range(rows):
        alone = gemv(x[r : r + 1], packed, scale, b, x_digits=True)
        assert torch.equal(alone.view(torch.int32), got[r : r + 1].view(torch.int32)), r  # NaN bits too


@pytest.mark.skipif(
    not amx_int8_available(), reason="no AMX-INT8 on this CPU, or the OS refused the tile state"
)
def test_int8_digits_kernel_refuses_more_input_features_than_its_int32_sums_hold() -> None:
    k = X4_MAX_IN_FEATURES + 1
    weight, scale = torch.ones(16, k, dtype=torch.int8), torch.ones(16)
    with pytest.raises(ValueError, match="at most"):
        gemv(torch.ones(1, k), weight, scale, x_digits=True)


def _w8a8_case(rows: int, fan_in: int, fan_out: int, spread: int, special: str, seed: int):  # type: ignore[no-untyped-def]
    """Rows spanning 2^±spread in magnitude, int8 weights, a bias; row ``rows // 2`` made special:
    all zero, or holding a NaN or an infinity, or tiny (its step underflows to zero)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g) * torch.exp2(
        torch.randint(-spread, spread + 1, (rows, fan_in), generator=g).float()
    )
    odd = rows // 2
    if special == "zero":
        x[odd] = 0.0
    elif special == "tiny":
        x[odd] = 1e-44
    elif special != "none":
        x[odd, fan_in // 2] = float("nan") if special == "nan" else -float("inf")
    weight, scale = quantize_int8(torch.randn(fan_out, fan_in, generator=g))
    return x, weight, scale, torch.randn(fan_out, generator=g), odd


W8A8_CASES = {
    "rows": st.integers(1, 17),
    "fan_in": st.integers(1, 300),
    "fan_out": st.integers(1, 40),
    "spread": st.integers(0, 30),
    "special": st.sampled_from(["none", "zero", "nan", "inf", "tiny"]),
    "seed": st.integers(0, 2**16),
}
"""Hypothesis strategies for :func:`_w8a8_case`'s arguments."""


@settings(max_examples=40, deadline=None)
@given(**W8A8_CASES)
def test_w8a8_activations_are_within_half_a_step_of_their_rows_largest(
    rows: int, fan_in: int, fan_out: int, spread: int, special: str, seed: int
) -> None:
    # Per token: step = max|x_row| / 127 and q = round(x / step) in [-127, 127]; a row's largest
    # is +-127 steps, a zero or underflowing row all zeros, a non-finite one a NaN step.
    x, *_, odd = _w8a8_case(rows, fan_in, fan_out, spread, special, seed)
    q, step = quantize_rows(x)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    fine = [r for r in range(rows) if r != odd or special == "none"]
    err = (q[fine].double() * step[fine, None].double() - x[fine].double()).abs()
    assert err.le(step[fine, None].double() * (0.5 + 2**-16)).all()  # x / step rounds in float32
    assert (q[fine].abs().amax(1) == 127).all()
    if special in ("zero", "tiny"):
        assert step[odd] == 0 and not q[odd].any()
    if special in ("nan", "inf"):
        assert step[odd].isnan()


@settings(max_examples=30, deadline=None)
@given(**W8A8_CASES, bias=st.booleans())
def test_w8a8_reference_is_the_exact_sum_of_the_quantized_activations(
    rows: int, fan_in: int, fan_out: int, spread: int, special: str, bias: bool, seed: int
) -> None:
    # The integer sums exact, then three roundings (to float32, the scales, the bias): within
    # float32 rounding of the exact product of the quantized activations and weights.
    x, weight, scale, b, odd = _w8a8_case(rows, fan_in, fan_out, spread, special, seed)
    b = b if bias else None
    got = w8a8_reference(x, weight, scale, b)
    q, step = quantize_rows(x)
    sums = (q.long() @ weight.long().T).double()  # in integers: a cancelling sum is exactly 0
    exact = sums * step.double()[:, None] * scale.double()[None, :]
    rounding = 2.0**-22 * (exact.abs() + (exact + (0 if b is None else b.double())).abs())
    exact = exact + (0 if b is None else b.double())
    assert got.dtype == torch.float32
    finite = [r for r in range(rows) if not (special in ("nan", "inf") and r == odd)]
    assert (got[finite].double() - exact[finite]).abs().le(rounding[finite] + 1e-30).all()
    if special in ("nan", "inf"):
        assert got[odd].isnan().all()


@pytest.mark.skipif(not w8a8_kernel_available(), reason=NO_W8A8)
@settings(max_examples=40, deadline=None)
@given(**W8A8_CASES, bias=st.booleans(), threads=st.integers(1, 3))
def test_w8a8_kernel_has_its_references_bits_alone_in_any_batch_and_split(
    rows: int, fan_in: int, fan_out: int, spread: int, special: str, bias: bool, threads: int, seed: int
) -> None:
    x, weight, scale, b, _ = _w8a8_case(rows, fan_in, fan_out, spread, special, seed)
    b = b if bias else None
    packed = pack_w8a8(weight)
    want = w8a8_reference(x, weight, scale, b).view(torch.int32)  # NaN bits too
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.equal(gemv_w8a8(x, packed, scale, b).view(torch.int32), want)
        for r in range(rows):
            assert torch.equal(
                gemv_w8a8(x[r : r + 1], packed, scale, b).view(torch.int32), want[r : r + 1]
            ), r
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def avx2_library(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The kernel library built for AVX2 (Haswell's instructions), to run here beside the native
    build: its w8a8 kernel takes another instruction path (VPMADDUBSW) to the same bits."""
    if not {"avx2", "fma", "bmi2"} <= cpu_flags():
        pytest.skip("this CPU cannot run an AVX2 (Haswell) build")
    out = tmp_path_factory.mktemp("avx2") / "gemv.so"
    error = compile_library(LIBRARY_SOURCE, out, march="haswell")
    if error is not None:
        pytest.skip(f"no AVX2 build here: {error}")
    lib = ctypes.CDLL(str(out))
    lib.gemv_i8a8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.gemv_i8a8.restype = ctypes.c_int
    return lib


@settings(max_examples=30, deadline=None)
@given(**W8A8_CASES, bias=st.booleans(), threads=st.integers(1, 3))
def test_w8a8_kernel_of_an_avx2_build_has_the_same_bits(  # type: ignore[no-untyped-def]
    avx2_library,
    rows: int,
    fan_in: int,
    fan_out: int,
    spread: int,
    special: str,
    seed: int,
    bias: bool,
    threads: int,
) -> None:
    x, weight, scale, b, _ = _w8a8_case(rows, fan_in, fan_out, spread, special, seed)
    b = b if bias else None
    packed = pack_w8a8(weight)
    y = torch.empty(rows, fan_out)
    args = (
        x.data_ptr(),
        packed.data.data_ptr(),
        scale.data_ptr(),
        None if b is None else b.data_ptr(),
        y.data_ptr(),
    )
    assert avx2_library.gemv_i8a8(*args, rows, fan_in, fan_out, threads) == 0
    assert torch.equal(y.view(torch.int32), w8a8_reference(x, weight, scale, b).view(torch.int32))


@pytest.mark.skipif(not w8a8_kernel_available(), reason=NO_W8A8)
def test_w8a8_kernel_refuses_more_input_features_than_its_int32_sums_hold() -> None:
    k = A8_MAX_IN_FEATURES + 1
    weight, scale = torch.ones(16, k, dtype=torch.int8), torch.ones(16)
    with pytest.raises(ValueError, match="at most"):
        gemv_w8a8(torch.ones(1, k), pack_w8a8(weight), scale)


@pytest.mark.parametrize("kernel", AVAILABLE)
@settings(max_examples=8, deadline=None)
@given(fan_in=st.integers(1, 200), fan_out=st.integers(1, 70), bias=st.booleans(), seed=st.integers(0, 999))
def test_candidate_is_close_to_nn_linear_and_batch_invariant(
    kernel: str, fan_in: int, fan_out: int, bias: bool, seed: int
) -> None:
    linear = _linear(fan_in, fan_out, bias, seed)
    layer = make_candidate(kernel, linear)
    assert layer is not None
    x = torch.randn(19, fan_in).to(layer.input_dtype)
    with torch.inference_mode():
        full = layer(x)
        want = linear(x.float())
        tol = TOLERANCE[kernel.rsplit("-", 1)[1]]
        scale = float(x.float().abs().sum(-1).max() * linear.weight.abs().max())
        torch.testing.assert_close(full.float(), want, rtol=tol, atol=tol * scale)
        if kernel in NOT_BATCH_INVARIANT:
            return
        for rows in (1, 2, 3, 4, 5, 8, 16, 17):
            assert torch.equal(layer(x[:rows]), full[:rows]), rows
        for i in (0, 6, 18):
            assert torch.equal(layer(x[i]), full[i]), i
        assert torch.equal(layer(x[:18].view(6, 3, fan_in)).reshape(18, fan_out), full[:18])


@settings(max_examples=30, deadline=None)
@given(fan_in=st.integers(1, 64), fan_out=st.integers(1, 16), seed=st.integers(0, 999))
def test_int8_quantization_is_within_half_a_step_per_channel(fan_in: int, fan_out: int, seed: int) -> None:
    w = torch.randn(fan_out, fan_in, generator=torch.Generator().manual_seed(seed))
    w[0] = 0.0  # an all-zero channel keeps a usable scale
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and (scale > 0).all()
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all()


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.tuples(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0), st.floats(1e-6, 1.0)),
        min_size=1,
    )
)
def test_one_kernel_per_shape_least_slow_over_the_buckets(
    times: dict[str, tuple[float, float, float]],
) -> None:
    buckets = (1, 4, 16)
    shape = (8, 8, False)
    table = choice.KernelTable(
        "float32", buckets, {shape: {k: dict(zip(buckets, t)) for k, t in times.items()}}
    )
    times = times | {"torch-fp32": (1e-9, 1e-9, 1e-9)}  # fastest everywhere, but not batch-invariant
    table.seconds[shape]["torch-fp32"] = dict(zip(buckets, times["torch-fp32"]))
    table.choose()
    eligible = {k: t for k, t in times.items() if k not in NOT_BATCH_INVARIANT}
    best = [min(t[i] for t in eligible.values()) for i in range(3)]

    def cost(k: str) -> float:
        return sum(times[k][i] / best[i] for i in range(3))

    assert cost(table.chosen[shape]) == min(cost(k) for k in eligible)


@given(
    st.tuples(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0), st.floats(1e-6, 1.0)),
    st.tuples(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0), st.floats(1e-6, 1.0)),
)
def test_a_kernel_the_stacks_cannot_run_is_kept_only_where_clearly_less_slow(
    ours: tuple[float, float, float], onednn: tuple[float, float, float]
) -> None:
    # One shape given to oneDNN leaves every layer of its stack unfused: it must win by a margin.
    buckets = (1, 4, 16)
    shape = (8, 8, False)
    times = {"gemv-fp32": ours, "onednn-fp32": onednn}
    table = choice.KernelTable(
        "float32", buckets, {shape: {k: dict(zip(buckets, t)) for k, t in times.items()}}
    )
    table.choose()
    best = [min(ours[i], onednn[i]) for i in range(3)]
    cost = {k: sum(t[i] / best[i] for i in range(3)) for k, t in times.items()}
    clearly = cost["onednn-fp32"] * (1 + choice.FUSABLE_MARGIN) < cost["gemv-fp32"]
    assert table.chosen[shape] == ("onednn-fp32" if clearly else "gemv-fp32")


def test_measured_table_is_cached_and_not_measured_again(kernel_cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    shapes = {(32, 48, False), (48, 32, True)}
    first = choice.measure_kernels(shapes, "float32", (1, 2))
    assert set(first.chosen) == shapes and all(k in FAMILIES["float32"] for k in first.chosen.values())
    cached = json.loads(choice.table_path().read_text())
    assert choice.table_path().parent == kernel_cache and cached
    monkeypatch.setattr(choice, "time_kernels", lambda *a, **k: pytest.fail("measured again"))
    again = choice.measure_kernels(shapes, "float32", (1, 2))
    assert again.seconds == first.seconds and again.chosen == first.chosen
    assert "*" in again.describe()


def test_a_kernel_this_machine_lacks_does_not_make_every_start_measure_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A CPU without AVX512-BF16 has no gemv-bf16dp: the cache must still hold the whole table.
    from tts_common.kernels import candidates

    def available(name: str) -> bool:
        return name != "gemv-bf16dp" and name in CANDIDATES

    monkeypatch.setattr(candidates, "candidate_available", available)
    monkeypatch.setattr(choice, "candidate_available", available, raising=False)
    kernels = ("torch-bf16", "gemv-bf16dp")
    first = choice.measure_kernels({(32, 48, False)}, "bfloat16", (1, 2), kernels=kernels)
    assert set(first.seconds[(32, 48, False)]) == {"torch-bf16"}
    monkeypatch.setattr(choice, "time_kernels", lambda *a, **k: pytest.fail("measured again"))
    again = choice.measure_kernels({(32, 48, False)}, "bfloat16", (1, 2), kernels=kernels)
    assert again.seconds == first.seconds and again.chosen == first.chosen


def test_set_up_linears_replaces_each_layer_and_refuses_what_cannot_run() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))
    x = torch.randn(3, 16)
    want = model(x)
    described, table = choice.set_up_linears(model, "cpu", torch.float32, "auto", "int8", (1, 2))
    assert table is not None and table.family == "int8" and described.startswith("int8")
    assert all(type(m) is not nn.Linear for m in model.modules())
    with torch.inference_mode():
        torch.testing.assert_close(model(x), want, rtol=0.05, atol=0.05 * float(want.abs().max()))
    with pytest.raises(ValueError, match="CPU only"):
        choice.set_up_linears(nn.Linear(4, 4), "cuda", torch.float32, "auto", "int8", (1,))
    with pytest.raises(ValueError, match="no int8 kernel"):
        choice.set_up_linears(nn.Linear(4, 4), "cpu", torch.float32, "onednn", "int8", (1,))
    plain = nn.Linear(4, 4)
    assert choice.set_up_linears(plain, "cpu", torch.float32, "torch", "none", (1,))[0].startswith("torch")
    with pytest.raises(ValueError, match="choose from none, int8, w8a8"):
        choice.set_up_linears(nn.Linear(4, 4), "cpu", torch.float32, "auto", "int4", (1,))


def test_w8a8_without_our_kernel_runs_its_torch_twin_and_says_it_is_slow(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    # An AVX-512 CPU without VNNI: the same bits from torch's int8 GEMM, and a warning to pick int8.
    from tts_common.kernels import candidates

    available = candidates.candidate_available
    monkeypatch.setattr(
        candidates, "candidate_available", lambda name: name != "gemv-w8a8" and available(name)
    )
    monkeypatch.setattr(choice, "candidate_available", candidates.candidate_available)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))
    x = torch.randn(3, 16)
    want = model(x)
    with caplog.at_level("WARNING", logger=choice.__name__):
        described, _ = choice.set_up_linears(model, "cpu", torch.float32, "auto", "w8a8", (1, 2))
    assert "slower than --quantization int8" in caplog.text
    assert {m.kernel for m in model.modules() if hasattr(m, "kernel")} == {"torch-w8a8"}, described
    with torch.inference_mode():
        torch.testing.assert_close(model(x), want, rtol=0.05, atol=0.05 * float(want.abs().max()))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(not bf16_dot_available(), reason="no AVX512-BF16 on this CPU"),
        ),
    ],
)
def test_int8_kernels_of_bf16_activations_are_timed_only_for_a_bfloat16_model(monkeypatch, dtype) -> None:  # type: ignore[no-untyped-def]
    # gemv-int8dp rounds its activations to bf16: a float32 model's int8 linears must never get
    # it (nor time it); a bfloat16 model's are exact in it, so it competes there.
    timed: list[tuple[str, ...]] = []

    def time_kernels(kernels, shape, buckets, repeat=1):  # type: ignore[no-untyped-def]
        timed.append(tuple(kernels))
        # gemv-int8dp fastest wherever it is timed: chosen wherever it is offered
        return {k: dict.fromkeys(buckets, 1e-6 if k == "gemv-int8dp" else 1e-3) for k in kernels}

    monkeypatch.setattr(choice, "time_kernels", time_kernels)
    monkeypatch.setattr(choice, "candidate_available", lambda name: True)
    model = nn.Sequential(nn.Linear(16, 32)).to(dtype)
    _, table = choice.set_up_linears(model, "cpu", dtype, "auto", "int8", (1, 2))
    assert table is not None and timed
    assert all(("gemv-int8dp" in kernels) == (dtype == torch.bfloat16) for kernels in timed)
    assert (set(table.chosen.values()) == {"gemv-int8dp"}) == (dtype == torch.bfloat16)


def test_a_cached_kernel_this_machine_lacks_is_never_chosen(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A cache dir shared with a host of the same CPU model name that had gemv-bf16dp: its faster
    # entry must not be chosen here, where the kernel cannot be built.
    from tts_common.kernels import candidates

    def available(name: str) -> bool:
        return name != "gemv-bf16dp" and name in CANDIDATES

    monkeypatch.setattr(candidates, "candidate_available", available)
    monkeypatch.setattr(choice, "candidate_available", available, raising=False)
    shape, kernels = (32, 48, False), ("torch-bf16", "gemv-bf16dp")
    choice.measure_kernels({shape}, "bfloat16", (1,), kernels=kernels)
    cached = json.loads(choice.table_path().read_text())
    key = f"gemv-bf16dp{kernel_revision('gemv-bf16dp')}|{choice.shape_key(shape)}|t{torch.get_num_threads()}"
    cached[key] = {"1": 1e-12}
    choice.table_path().write_text(json.dumps(cached))
    table = choice.measure_kernels({shape}, "bfloat16", (1,), kernels=kernels)
    assert table.chosen == {shape: "torch-bf16"}


@pytest.mark.skipif(not gemv_available(), reason=NO_LIBRARY)
def test_a_cached_timing_of_another_build_of_our_kernel_is_measured_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Our kernel's timings are keyed by its source: a cache written by an earlier (slower or
    # faster) build must not choose for this one.
    shape, kernels = (32, 48, False), ("gemv-int8",)
    stale = f"gemv-int8|{choice.shape_key(shape)}|t{torch.get_num_threads()}"  # before revisions
    choice.table_path().parent.mkdir(parents=True, exist_ok=True)
    choice.table_path().write_text(json.dumps({stale: {"1": 1e-12}}))
    measured = []
    real = choice.time_kernels
    monkeypatch.setattr(choice, "time_kernels", lambda *a, **k: measured.append(a) or real(*a, **k))
    table = choice.measure_kernels({shape}, "int8", (1,), kernels=kernels)
    assert measured and table.seconds[shape]["gemv-int8"][1] > 1e-12


@pytest.mark.skipif(not gemv_available(), reason=NO_LIBRARY)
def test_gemv_build_is_keyed_by_the_cpu_flags_not_only_its_model_name(kernel_cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # -march=native builds for the flags of the CPU at hand; a host of the same model name with
    # fewer flags (a VM masking some, a generic "AMD EPYC") sharing the cache must not load it.
    from tts_common import cpu_info
    from tts_common.kernels import gemv as gemv_module

    flags = gemv_module.cpu_flags()
    built = []
    try:
        for extra in (frozenset(), frozenset({"avx512_made_up"})):
            monkeypatch.setattr(gemv_module, "cpu_flags", lambda extra=extra: flags | extra)
            monkeypatch.setattr(cpu_info, "cpu_flags", lambda cpuinfo=None, extra=extra: flags | extra)
            gemv_module._library.cache_clear()
            assert gemv_module._library() is not None
            built.append(sorted(p.name for p in kernel_cache.glob("gemv-*.so")))
    finally:
        gemv_module._library.cache_clear()
    assert len(built[0]) == 1 and len(built[1]) == 2


FUSABLE_KERNELS = [
    k
    for k in (
        "gemv-int8",
        "gemv-bf16",
        "gemv-bf16dp",
        "gemv-bf16amx",
        "gemv-int8amx",
        "gemv-int8x4amx",
        "gemv-w8a8",
    )
    if candidate_available(k)
]


@pytest.mark.skipif(not FUSABLE_KERNELS, reason=NO_LIBRARY)
@settings(max_examples=20, deadline=None)
@given(
    kernel=st.sampled_from(FUSABLE_KERNELS or ["gemv-int8"]),
    groups=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    fan_in=st.integers(1, 300),
    bias=st.booleans(),
    rows=st.integers(1, 9),
    seed=st.integers(0, 999),
)
def test_fused_projections_give_each_channel_its_own_layers_bits(
    kernel: str, groups: list[int], fan_in: int, bias: bool, rows: int, seed: int
) -> None:
    parts = [make_candidate(kernel, _linear(fan_in, 16 * g, bias, seed + i)) for i, g in enumerate(groups)]
    fused = fuse_outputs(parts)
    assert fused is not None and fused.out_features == 16 * sum(groups)
    x = torch.randn(rows, fan_in, generator=torch.Generator().manual_seed(seed)).to(fused.input_dtype)
    with torch.inference_mode():
        assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))
        assert torch.equal(fused(x[:1]), fused(x)[:1])  # and batch-invariant


@pytest.mark.skipif(not FUSABLE_KERNELS, reason=NO_LIBRARY)
def test_only_whole_groups_of_one_kernel_are_fused() -> None:
    kernel = FUSABLE_KERNELS[0]
    whole = make_candidate(kernel, _linear(32, 16, False, 0))
    assert fuse_outputs([whole, make_candidate(kernel, _linear(32, 24, False, 1))]) is None
    assert fuse_outputs([whole, make_candidate(kernel, _linear(32, 16, True, 1))]) is None
    assert fuse_outputs([whole, make_candidate("torch-bf16", _linear(32, 16, False, 1))]) is None
    assert fuse_outputs([whole, None]) is None


@pytest.mark.skipif(not candidate_available("gemv-int8"), reason=NO_LIBRARY)
def test_set_up_linears_fuses_gate_and_up_without_changing_a_bit(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tts_common.layers import GatedMLP

    torch.manual_seed(0)
    fused, separate = GatedMLP(48, 64), GatedMLP(48, 64)
    separate.load_state_dict(fused.state_dict())
    described, _ = choice.set_up_linears(fused, "cpu", torch.float32, "gemv", "int8", (1, 4))
    assert fused.gate_up_proj is not None and fused.gate_proj is None and "fused" in described
    monkeypatch.setattr(choice, "fuse_outputs", lambda layers: None)
    choice.set_up_linears(separate, "cpu", torch.float32, "gemv", "int8", (1, 4))
    assert separate.gate_up_proj is None
    x = torch.randn(5, 3, 48)
    with torch.inference_mode():
        assert torch.equal(fused(x), separate(x))


@pytest.mark.skipif(not gemv_available(), reason=NO_LIBRARY)
@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from(GEMV_KINDS),
    rows=st.integers(1, 17),
    fan_in=st.integers(1, 400),
    fan_out=st.integers(1, 300),
    threads=st.integers(2, 4),
    seed=st.integers(0, 999),
)
def test_gemv_shared_between_threads_has_the_bits_of_one_thread(
    kind: str, rows: int, fan_in: int, fan_out: int, threads: int, seed: int
) -> None:
    # The calling thread and our workers split the outputs (no join barrier): a split, whoever
    # computes a chunk, and calls from several Python threads at once never change a bit.
    x, weight, scale, b = _gemv_case(kind, rows, fan_in, fan_out, True, seed)
    packed = _packed(kind, weight)
    alone = _run(kind, x, packed, scale, b)  # one torch thread (the fixture)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results: list[torch.Tensor] = []

        def call() -> None:
            for _ in range(20):
                results.append(_run(kind, x, packed, scale, b))

        callers = [threading.Thread(target=call) for _ in range(3)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        assert torch.equal(_run(kind, x[:1], packed, scale, b), alone[:1])
    finally:
        torch.set_num_threads(before)
    assert len(results) == 60 and all(torch.equal(r, alone) for r in results)


@pytest.mark.skipif(not gemv_available(), reason=NO_LIBRARY)
def test_a_cache_it_cannot_build_into_leaves_the_torch_path(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Built beside its cache file (os.replace across filesystems fails: a container's volume),
    # and where even that cannot be written the kernel is unavailable, not a failed start.
    from tts_common.kernels import gemv as gemv_module

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "kernels"))
    gemv_module._library.cache_clear()
    try:
        assert gemv_module._library() is None
        monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
        gemv_module._library.cache_clear()
        assert gemv_module._library() is not None
        assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".so")] == []
    finally:
        gemv_module._library.cache_clear()
