"""--dtype auto: on CPU each stage's own step is timed in float32 and bfloat16 and bfloat16 kept
only where it is faster over the row counts and slower at none (never by CPU flags alone), the timings cached per
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
    NOISE,
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
def test_auto_on_cpu_is_bf16_only_where_the_stage_step_is_faster_overall_and_slower_at_no_row_count(
    fp32: dict[int, float], bf16: dict[int, float]
) -> None:
    step = FakeStep({"float32": fp32, "bfloat16": bf16}, what=f"{fp32} {bf16}")  # fresh cache key
    got = resolve_dtype("auto", "cpu", step.probe)
    ratios = [bf16[b] / fp32[b] for b in BUCKETS]
    kept = all(r <= 1 + NOISE for r in ratios) and sum(ratios) < len(BUCKETS)
    assert got == ("bfloat16" if kept else "float32")
    if got == "bfloat16":  # never slower than float32 at any row count, beyond the timing noise
        assert all(bf16[b] <= (1 + NOISE) * fp32[b] for b in BUCKETS)
    # float32 at every row count, then bfloat16 (one dtype at a time), rows ascending, ROUNDS
    # times each; bfloat16 once where DECISIVE times slower, and not past the first rows where it
    # is slower (float32 already).
    timed = [1] if bf16[1] > (1 + NOISE) * fp32[1] else [1, 8]
    rounds = {b: 1 if bf16[b] > DECISIVE * fp32[b] else ROUNDS for b in timed}
    expected = [("float32", b) for b in BUCKETS for _ in range(ROUNDS)]
    expected += [("bfloat16", b) for b in timed for _ in range(rounds[b])]
    assert step.calls == expected


def test_a_tie_at_one_row_does_not_throw_away_a_win_at_eight() -> None:
    # The int8 talker step on a Zen 4 EPYC (ms, best of 3): the same at one row, 1.4x as fast in
    # bfloat16 at eight; a strict "faster at every row count" let the noise pick float32.
    tie = FakeStep({"float32": {1: 56.6, 8: 162.2}, "bfloat16": {1: 56.7, 8: 113.5}}, "int8 step")
    assert resolve_dtype("auto", "cpu", tie.probe) == "bfloat16"
    slower = FakeStep({"float32": {1: 56.6, 8: 162.2}, "bfloat16": {1: 60.0, 8: 113.5}}, "slower at one")
    assert resolve_dtype("auto", "cpu", slower.probe) == "float32" and ("bfloat16", 8) not in slower.calls
    equal = FakeStep({"float32": {1: 50.0, 8: 100.0}, "bfloat16": {1: 50.0, 8: 100.0}}, "no faster")
    assert resolve_dtype("auto", "cpu", equal.probe) == "float32"


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


def test_hosts_of_one_model_name_but_another_generation_or_flags_get_their_own_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # KVM guests report a bare "AMD EPYC" for Zen 3 and Zen 4 alike: a measured choice cached
    # on one (bf16 on Zen 4) must not be read on the other.
    from tts_common.kernels import cache

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    identity_of = cpu_info.cpu_identity
    files = {}
    for name, model, flags in (
        ("zen3", "1", "fpu avx2 fma"),
        ("zen4", "17", "fpu avx2 fma avx512f avx512_bf16"),
        ("zen4-masked", "17", "fpu avx2 fma"),
    ):
        info = tmp_path / name
        info.write_text(
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
            f"model\t\t: {model}\nmodel name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: {flags}\n\n"
            "processor\t: 1\nmodel\t\t: 99\n"
        )
        identity = identity_of(info)
        assert identity.startswith(f"AMD EPYC (family 25, model {model}, stepping 1, flags ")
        monkeypatch.setattr(cpu_info, "cpu_identity", lambda identity=identity: identity)
        files[name] = cache.machine_cache_file("auto-dtype")
    assert len(set(files.values())) == 3
    assert identity_of(tmp_path / "missing") == "unknown"


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
