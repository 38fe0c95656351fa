"""The speaker stage's ``--dtype auto`` step (speaker_service/model/dtype_probe.py) on the tiny
Base checkpoint: one reference through the front end, loaded once per dtype."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from speaker_service.model import VoiceCloneFrontEnd
from speaker_service.model.dtype_probe import CLIP_SECONDS, checkpoint_speaker_probe
from tests.helpers.dtype_probes import (
    assert_measured_once_then_cached,
    assert_times_each_dtype_loading_it_once,
)
from tts_common.auto_dtype import StepProbe, measured_cpu_dtype
from tts_common.kernels.cache import CACHE_ENV

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "ckpt"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def probe_and_loads() -> Iterator[tuple[StepProbe, list[str]]]:
    """The probe of tiny_base, with every front-end load it makes recorded (by dtype)."""
    loads: list[str] = []
    load = VoiceCloneFrontEnd.from_checkpoint

    def counted(path, device="cpu", dtype=None):  # type: ignore[no-untyped-def]
        loads.append(str(dtype).removeprefix("torch."))
        return load(path, device, dtype)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VoiceCloneFrontEnd, "from_checkpoint", counted)
        yield checkpoint_speaker_probe(CKPT / "tiny_base"), loads


def test_probe_is_one_reference_at_one_row(probe_and_loads: tuple[StepProbe, list[str]]) -> None:
    probe, _ = probe_and_loads
    assert probe.stage == "speaker" and probe.buckets == (1,)
    # the cache key names what the time depends on: clip length, encoder sizes
    assert f"{CLIP_SECONDS:g} s reference at 24000 Hz" in probe.what
    assert "channels 32/32/32/32/96" in probe.what and "1 layers of 32" in probe.what
    assert probe.key.startswith("speaker: ") and "rows 1;" in probe.key


def test_steps_time_each_dtype_and_load_each_once(probe_and_loads: tuple[StepProbe, list[str]]) -> None:
    assert_times_each_dtype_loading_it_once(*probe_and_loads)


def test_measured_dtype_is_cached(
    probe_and_loads: tuple[StepProbe, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert_measured_once_then_cached(probe_and_loads[0], tmp_path)


def test_checkpoint_without_speaker_encoder_keeps_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CustomVoice checkpoint serves no voice cloning (the stage answers unavailable): nothing
    is loaded or timed, and auto means float32 rather than a failed start."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    probe = checkpoint_speaker_probe(CKPT / "tiny_custom_voice")
    assert probe.stage == "speaker" and "no speaker encoder" in probe.what
    assert probe.step_seconds("bfloat16", 1) == 0.0
    assert measured_cpu_dtype(probe) == "float32"
