"""Checks every stage's ``--dtype auto`` probe passes (tts_common.auto_dtype.StepProbe)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tts_common.auto_dtype import CANDIDATES, StepProbe, measured_cpu_dtype, probe_cache_path


def assert_times_each_dtype_loading_it_once(probe: StepProbe, loads: list[str]) -> None:
    """Timing one dtype at a time (as ``measured_cpu_dtype`` does) loads each dtype's model once
    and keeps it for every call; going back to a dtype loads it again (the other was dropped).
    ``loads``: the dtype names the probe's loader was called with, so far none."""
    for dtype in CANDIDATES:
        for _ in range(2):
            for rows in probe.buckets:
                seconds = probe.step_seconds(dtype, rows)
                assert isinstance(seconds, float) and math.isfinite(seconds) and seconds > 0
    assert loads == list(CANDIDATES)
    probe.step_seconds(CANDIDATES[0], probe.buckets[0])
    assert loads == [*CANDIDATES, CANDIDATES[0]]


def assert_measured_once_then_cached(probe: StepProbe, cache: Path) -> None:
    """``measured_cpu_dtype`` times ``probe`` into the cache file under ``cache`` (the
    ``QWEN3TTS_KERNEL_CACHE`` of the test), and a second probe of the same key is not timed."""
    assert measured_cpu_dtype(probe) in CANDIDATES
    path = probe_cache_path()
    assert path.parent == cache
    times = json.loads(path.read_text())[probe.key]
    assert set(times) == set(CANDIDATES) and all(t > 0 for t in times["float32"].values())

    def no_step(dtype: str, rows: int) -> float:
        raise AssertionError("a cached probe is not timed again")

    assert measured_cpu_dtype(StepProbe(probe.stage, probe.what, no_step, probe.buckets)) in CANDIDATES
