"""--dtype auto and --linear auto: the choice follows the machine's flags and the slot count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tts_common.precision import (
    AMX_ONEDNN_MIN_SLOTS,
    DTYPES,
    cpu_flags,
    cpu_has_native_bf16,
    cpu_model,
    resolve_dtype,
    use_onednn_linears_for,
)

ZEN1 = frozenset({"avx2", "fma", "sse4_2"})
SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
COOPER_LAKE = frozenset({"avx2", "avx512f", "avx512_bf16"})
GRAVITON3 = frozenset({"fp", "asimd", "sve", "bf16", "i8mm"})


def test_auto_dtype_on_cpu_follows_native_bf16() -> None:
    assert resolve_dtype("auto", "cpu", flags=ZEN1) == "float32"
    for flags in (SAPPHIRE_RAPIDS, COOPER_LAKE, GRAVITON3):
        assert resolve_dtype("auto", "cpu", flags=flags) == "bfloat16"


@given(st.sampled_from(DTYPES), st.sampled_from([ZEN1, SAPPHIRE_RAPIDS, frozenset()]))
def test_explicit_dtypes_are_kept(name: str, flags: frozenset[str]) -> None:
    assert resolve_dtype(name, "cpu", flags=flags) == name


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", "cpu")


def test_cpuinfo_parsing(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7571\nflags\t\t: fpu avx2 avx512_bf16\n\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"} and cpu_has_native_bf16(cpu_flags(info))
    assert cpu_model(info) == "AMD EPYC 7571"
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpu_model(tmp_path / "missing") == "unknown"
    # This machine: whatever it is, auto gives one of the two documented answers.
    assert resolve_dtype("auto", "cpu") in ("float32", "bfloat16")


@given(st.integers(min_value=1, max_value=256), st.sampled_from([ZEN1, SAPPHIRE_RAPIDS, COOPER_LAKE]))
def test_linear_choice_rule(slots: int, flags: frozenset[str]) -> None:
    amx = "amx_tile" in flags
    auto = use_onednn_linears_for("auto", "cpu", torch.float32, slots, flags=flags)
    assert auto == (not amx or slots >= AMX_ONEDNN_MIN_SLOTS)
    assert use_onednn_linears_for("onednn", "cpu", torch.float32, slots, flags=flags)
    assert not use_onednn_linears_for("torch", "cpu", torch.float32, slots, flags=flags)
    # Only CPU float32 models can use the packed kernels.
    for choice in ("auto", "onednn"):
        assert not use_onednn_linears_for(choice, "cpu", torch.bfloat16, slots, flags=flags)
        assert not use_onednn_linears_for(choice, "cuda", torch.float32, slots, flags=flags)


def test_stage_processes_resolve_auto_before_building_their_config() -> None:
    from tts_common.stage_main import StageModelConfig, resolve_model_config

    auto = resolve_model_config(StageModelConfig(model="m", device="cpu", dtype="auto"))
    assert auto.dtype == resolve_dtype("auto", "cpu") and auto.model == "m"
    for name in DTYPES:
        fixed = StageModelConfig(model="m", device="cpu", dtype=name)
        assert resolve_model_config(fixed) is fixed
