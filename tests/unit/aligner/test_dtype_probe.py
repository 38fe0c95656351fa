"""The aligner's ``--dtype auto`` step (aligner_service/model/dtype_probe.py) on the tiny aligner
checkpoint: one batched forward pass at 1 and 8 rows, the model loaded once per dtype."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aligner_service.model import dtype_probe
from aligner_service.model.dtype_probe import CLIP_SECONDS, WORDS, checkpoint_aligner_probe
from tests.helpers.dtype_probes import (
    assert_measured_once_then_cached,
    assert_times_each_dtype_loading_it_once,
)
from tts_common.auto_dtype import StepProbe
from tts_common.kernels.cache import CACHE_ENV

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "aligner" / "ckpt"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def probe_and_loads() -> Iterator[tuple[StepProbe, list[str]]]:
    """The probe of the fixture checkpoint, with every model load it makes recorded (by dtype)."""
    loads: list[str] = []
    load = dtype_probe.load_aligner

    def counted(path, *, device="cpu", dtype=None):  # type: ignore[no-untyped-def]
        loads.append(str(dtype).removeprefix("torch."))
        return load(path, device=device, dtype=dtype)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dtype_probe, "load_aligner", counted)
        yield checkpoint_aligner_probe(CKPT), loads


def test_probe_is_a_batched_pass_at_1_and_8_rows(probe_and_loads: tuple[StepProbe, list[str]]) -> None:
    probe, _ = probe_and_loads
    assert probe.stage == "aligner" and probe.buckets == (1, 8)
    # the cache key names what the time depends on: clip length, words, model sizes
    assert f"a {CLIP_SECONDS:g} s utterance of {len(WORDS)} words" in probe.what
    assert "2 layers of 32" in probe.what and "2 layers of 64, intermediate 128" in probe.what
    assert probe.key.startswith("aligner: ") and "rows 1/8;" in probe.key


def test_steps_time_each_dtype_and_load_each_once(probe_and_loads: tuple[StepProbe, list[str]]) -> None:
    assert_times_each_dtype_loading_it_once(*probe_and_loads)


def test_measured_dtype_is_cached(
    probe_and_loads: tuple[StepProbe, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert_measured_once_then_cached(probe_and_loads[0], tmp_path)
