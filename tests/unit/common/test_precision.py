"""--dtype auto: on CPU it follows the measured frame time of the linears (bfloat16 only where
it is faster at every bucket), never the CPU flags alone; explicit dtypes are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_common.kernels import choice
from tts_common.precision import DTYPES, cpu_flags, cpu_has_native_bf16, cpu_model, resolve_dtype


def _fake_tables(monkeypatch: pytest.MonkeyPatch, fp32: dict[int, float], bf16: dict[int, float]) -> None:
    """Make the measurement return tables whose whole-frame times are ``fp32``/``bf16`` (seconds
    per bucket), with one shape called once."""
    shape = (8, 8, False)

    def measure(shapes: object, family: str, buckets: tuple[int, ...]) -> choice.KernelTable:
        times = fp32 if family == "float32" else bf16
        table = choice.KernelTable(family, tuple(buckets), {shape: {"k": dict(times)}})
        table.choose()
        return table

    monkeypatch.setattr(choice, "measure_kernels", measure)
    monkeypatch.setattr(choice, "frame_linear_calls", lambda cfg: {shape: 1})
    monkeypatch.setattr(choice, "cpu_has_native_bf16", lambda: True)


@given(
    st.dictionaries(st.sampled_from([1, 8]), st.floats(1e-4, 1.0), min_size=2, max_size=2),
    st.dictionaries(st.sampled_from([1, 8]), st.floats(1e-4, 1.0), min_size=2, max_size=2),
)
def test_auto_on_cpu_is_bf16_only_when_measured_faster_at_every_bucket(
    fp32: dict[int, float], bf16: dict[int, float]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _fake_tables(mp, fp32, bf16)
        got = resolve_dtype("auto", "cpu")
    assert got == ("bfloat16" if all(bf16[b] < fp32[b] for b in (1, 8)) else "float32")


def test_auto_on_cpu_without_bf16_arithmetic_is_float32_even_where_bf16_linears_are_faster() -> None:
    with pytest.MonkeyPatch.context() as mp:
        _fake_tables(mp, {1: 1.0, 8: 1.0}, {1: 0.1, 8: 0.1})
        assert resolve_dtype("auto", "cpu") == "bfloat16"
        mp.setattr(choice, "cpu_has_native_bf16", lambda: False)
        assert resolve_dtype("auto", "cpu") == "float32"


@given(st.sampled_from(DTYPES))
def test_explicit_dtypes_are_kept(name: str) -> None:
    assert resolve_dtype(name, "cpu") == name


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", "cpu")


def test_cpuinfo_parsing(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7571\nflags\t\t: fpu avx2 avx512_bf16\n\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"} and cpu_has_native_bf16(cpu_flags(info))
    assert cpu_model(info) == "AMD EPYC 7571"
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpu_model(tmp_path / "missing") == "unknown"


def test_stage_processes_resolve_auto_before_building_their_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from tts_common.stage_main import StageModelConfig, resolve_model_config

    _fake_tables(monkeypatch, {1: 2.0, 8: 2.0}, {1: 1.0, 8: 1.0})
    auto = resolve_model_config(StageModelConfig(model="m", device="cpu", dtype="auto"))
    assert auto.dtype == "bfloat16" and auto.model == "m"
    for name in DTYPES:
        fixed = StageModelConfig(model="m", device="cpu", dtype=name)
        assert resolve_model_config(fixed) is fixed
