"""The talker's step for --dtype auto on CPU: a whole decode step of the checkpoint's own talker
in each dtype, with the kernels the engine would choose (the fused stacks included)."""

from __future__ import annotations

import math

import pytest
import torch

from talker_service.engine import EngineConfig, dtype_probe
from talker_service.model.loader import TalkerModel
from tests.helpers.fixtures import CKPT_DIR
from tts_common.auto_dtype import CANDIDATES, measured_cpu_dtype, probe_cache_path
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.gemv import w8a8_kernel_available

CKPT = CKPT_DIR / "tiny_custom_voice"


@pytest.mark.parametrize(
    "quantization",
    [
        "none",
        "int8",
        pytest.param(
            "w8a8",
            marks=pytest.mark.skipif(not w8a8_kernel_available(), reason="no w8a8 GEMV here to force"),
        ),
    ],
)
def test_the_probe_times_decode_steps_of_the_checkpoint_with_the_engine_kernels(
    quantization: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    loads: list[torch.dtype] = []
    set_up: list[tuple[torch.dtype, str, str, tuple[int, ...]]] = []
    steps: list[tuple[torch.dtype, int]] = []
    load, choose, step = TalkerModel.from_checkpoint, dtype_probe.set_up_linears, dtype_probe.decode_step

    def counted_load(path: object, device: object, dtype: torch.dtype) -> TalkerModel:
        loads.append(dtype)
        return load(path, device, dtype)  # type: ignore[arg-type]

    def recorded_choice(module, device, dtype, linear, quant, buckets):  # type: ignore[no-untyped-def]
        set_up.append((dtype, linear, quant, tuple(buckets)))
        return choose(module, device, dtype, linear, quant, buckets)

    def counted_step(talker, cache, state, trailing, *args, **kwargs):  # type: ignore[no-untyped-def]
        attend_len, talker_noise, cp_noise = args
        assert talker_noise is not None and cp_noise is not None  # a default request samples
        steps.append((trailing.dtype, int(state.positions.shape[0])))  # the model's dtype, its rows
        return step(talker, cache, state, trailing, *args, **kwargs)

    monkeypatch.setattr(TalkerModel, "from_checkpoint", counted_load)
    monkeypatch.setattr(dtype_probe, "set_up_linears", recorded_choice)
    monkeypatch.setattr(dtype_probe, "decode_step", counted_step)
    engine = EngineConfig(linear="gemv", quantization=quantization)  # forced: nothing to measure
    probe = dtype_probe.checkpoint_talker_probe(CKPT, engine)
    assert probe.stage == "talker" and probe.buckets == (1, 8)
    assert f"--linear gemv --quantization {quantization} for rows (1, 2, 4, 8, 16)" in probe.what
    assert dtype_probe.checkpoint_talker_probe(CKPT, EngineConfig(max_slots=4)).buckets == (1, 4)
    for dtype in CANDIDATES:  # one dtype at a time, as tts_common.auto_dtype times them
        for rows in probe.buckets:
            seconds = probe.step_seconds(dtype, rows)
            assert math.isfinite(seconds) and seconds > 0
    assert loads == [torch.float32, torch.bfloat16]  # once per dtype, kept for every row count
    assert set_up == [(d, "gemv", quantization, engine.graph_buckets) for d in loads]  # as the engine does
    # A warm-up step of every row count at load, then the timed ones, each over all its rows.
    assert steps == [(d, rows) for d in loads for _ in ("warm", "timed") for rows in (1, 8)]
    assert measured_cpu_dtype(probe) in CANDIDATES and probe.key in probe_cache_path().read_text()


def test_the_step_runner_prefills_again_when_its_cache_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtype_probe, "ROOM", 3)
    model = TalkerModel.from_checkpoint(CKPT)
    run = dtype_probe.decode_step_runner(model, rows=2, steps=2, prompt=4)
    for _ in range(5):  # 10 steps through a cache of 4 + 3 + 1 positions
        run()
