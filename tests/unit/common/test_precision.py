"""--dtype auto: on CPU each stage's own step is timed in float32 and bfloat16 and bfloat16 kept
only where it is faster at every row count (never by CPU flags alone), the timings cached per
CPU model, torch version, step and thread count; explicit dtypes are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_common import cpu_info
from tts_common.auto_dtype import (
    DECISIVE,
    ROUNDS,
    StepProbe,
    measured_cpu_dtype,
    probe_cache_path,
)
from tts_common.kernels.cache import CACHE_ENV
from tts_common.precision import DTYPES, cpu_flags, cpu_has_native_bf16, cpu_model, resolve_dtype

BUCKETS = (1, 8)
seconds = st.floats(1e-4, 1.0)
times_by_rows = st.fixed_dictionaries(dict.fromkeys(BUCKETS, seconds))


class FakeStep:
    """A stage step whose time per dtype and rows is given; records every call."""

    def __init__(self, times: dict[str, dict[int, float]], what: str = "a step") -> None:
        self.times = times
        self.calls: list[tuple[str, int]] = []
        self.what = what

    def probe(self) -> StepProbe:
        return StepProbe("stage", self.what, self.step_seconds, BUCKETS)

    def step_seconds(self, dtype: str, rows: int) -> float:
        self.calls.append((dtype, rows))
        return self.times[dtype][rows]


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test measures into its own cache folder (never the user's)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@settings(max_examples=60)
@given(times_by_rows, times_by_rows)
def test_auto_on_cpu_is_bf16_only_where_the_stage_step_is_faster_at_every_row_count(
    fp32: dict[int, float], bf16: dict[int, float]
) -> None:
    step = FakeStep({"float32": fp32, "bfloat16": bf16}, what=f"{fp32} {bf16}")  # fresh cache key
    got = resolve_dtype("auto", "cpu", step.probe)
    assert got == ("bfloat16" if all(bf16[b] < fp32[b] for b in BUCKETS) else "float32")
    # float32 at every row count, then bfloat16 (one dtype at a time), rows ascending, ROUNDS
    # times each; bfloat16 once where DECISIVE times slower, and not past the first rows where it
    # is not faster (float32 already).
    timed = [1] if bf16[1] >= fp32[1] else [1, 8]
    rounds = {b: 1 if bf16[b] > DECISIVE * fp32[b] else ROUNDS for b in timed}
    expected = [("float32", b) for b in BUCKETS for _ in range(ROUNDS)]
    expected += [("bfloat16", b) for b in timed for _ in range(rounds[b])]
    assert step.calls == expected


def test_the_choice_does_not_look_at_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever flags the CPU reports (none, or bf16 arithmetic), only the times decide.
    for flags in (frozenset(), frozenset({"avx2", "fma"}), frozenset({"avx512_bf16", "amx_bf16"})):
        monkeypatch.setattr(cpu_info, "cpu_flags", lambda cpuinfo=None, f=flags: f)
        has_bf16 = cpu_has_native_bf16()
        faster = FakeStep({"float32": {1: 2.0, 8: 2.0}, "bfloat16": {1: 1.0, 8: 1.0}}, f"fast {has_bf16}")
        slower = FakeStep({"float32": {1: 1.0, 8: 1.0}, "bfloat16": {1: 2.0, 8: 2.0}}, f"slow {has_bf16}")
        assert resolve_dtype("auto", "cpu", faster.probe) == "bfloat16"
        assert resolve_dtype("auto", "cpu", slower.probe) == "float32"


def test_timings_are_cached_per_step_and_thread_count(kernel_cache: Path) -> None:
    step = FakeStep({"float32": {1: 2.0, 8: 2.0}, "bfloat16": {1: 1.0, 8: 1.0}})
    assert measured_cpu_dtype(step.probe()) == "bfloat16"
    measured = len(step.calls)
    assert measured_cpu_dtype(step.probe()) == "bfloat16" and len(step.calls) == measured  # cached
    path = probe_cache_path()
    assert path.parent == kernel_cache and path.name.endswith(f"-torch{torch.__version__}.json")
    entry = json.loads(path.read_text())[step.probe().key]
    assert entry == {"float32": {"1": 2.0, "8": 2.0}, "bfloat16": {"1": 1.0, "8": 1.0}}
    other = FakeStep(step.times, what="another checkpoint's step")
    measured_cpu_dtype(other.probe())
    assert other.calls  # a different step is measured, not taken from the first one's entry
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        measured_cpu_dtype(step.probe())
        assert len(step.calls) == 2 * measured  # another thread count is measured again
    finally:
        torch.set_num_threads(threads)


def test_auto_on_cpu_needs_the_stage_step() -> None:
    with pytest.raises(ValueError, match="own step"):
        resolve_dtype("auto", "cpu")


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


def test_stage_processes_resolve_auto_on_their_own_step_before_building_their_config() -> None:
    from tts_common.stage_main import StageModelConfig, resolve_model_config

    probed: list[bool] = []

    def probe() -> StepProbe:
        probed.append(True)
        return FakeStep({"float32": {1: 2.0, 8: 2.0}, "bfloat16": {1: 1.0, 8: 1.0}}).probe()

    auto = resolve_model_config(StageModelConfig(model="m", device="cpu", dtype="auto"), probe)
    assert auto.dtype == "bfloat16" and auto.model == "m" and probed == [True]
    for name in DTYPES:
        fixed = StageModelConfig(model="m", device="cpu", dtype=name)
        assert resolve_model_config(fixed, probe) is fixed
    assert probed == [True]  # an explicit dtype times nothing


@pytest.mark.parametrize("stage", ["talker", "decoder", "speaker", "aligner"])
def test_every_stage_process_resolves_auto_on_its_own_step(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from tts_common.stage_main import StageModelConfig

    entry = importlib.import_module(f"{stage}_service.__main__")
    seen: dict[str, object] = {}
    probed: list[tuple] = []
    monkeypatch.setattr(entry, "run_stage_process", lambda **kw: seen.update(kw))
    monkeypatch.setattr(entry, f"checkpoint_{stage}_probe", lambda *a: probed.append(a) or "probe")
    entry.main([])
    flags = ["--quantization", "int8", "--max-slots", "4"] if stage == "talker" else []
    args = entry.FLAGS.parser().parse_args(["--model", "ckpt", *flags])
    assert seen["cpu_dtype_probe"](StageModelConfig(model="ckpt"), args) == "probe"  # type: ignore[operator]
    assert [a[0] for a in probed] == ["ckpt"]
    if stage == "talker":  # timed in the engine the flags set up
        engine = probed[0][1]
        assert (engine.quantization, engine.max_slots) == ("int8", 4)
