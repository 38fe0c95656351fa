"""Bad alignment inputs and bad checkpoints fail with clear errors; the audio front end follows
the official normalisation (mono mean, soxr HQ to 16 kHz, peak division only above full scale)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from aligner_service.model import (
    AlignerCheckpointError,
    AlignInput,
    AlignInputError,
    ForcedAligner,
    load_aligner,
)
from aligner_service.model.audio_encoder import audio_token_count
from aligner_service.model.frontend import prepare_waveform
from tts_common.audio import resample

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "aligner"


@pytest.fixture(scope="module")
def aligner() -> ForcedAligner:
    return load_aligner(FIXTURE / "ckpt")


def noise(n: int, scale: float = 0.3) -> np.ndarray:
    return (np.random.default_rng(n).standard_normal(n) * scale).astype(np.float32)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (AlignInput(noise(16000), 7000, ["a"]), "sample rate"),
        (AlignInput(noise(16000), 16000, []), "at least one word"),
        (AlignInput(noise(16000), 16000, ["a", ""]), "word 1 is empty"),
        (AlignInput(noise(16000), 16000, ["a", "b c"]), "word 1 contains whitespace"),
        (AlignInput(noise(16000), 16000, ["a<timestamp>"]), "reserved token"),
        (AlignInput(noise(16000), 16000, ["<|audio_pad|>"]), "reserved token"),
        (AlignInput(np.full(16000, np.nan, dtype=np.float32), 16000, ["a"]), "NaN"),
        (AlignInput((noise(16000) * 32767).astype(np.int16), 16000, ["a"]), "floating point"),
        (AlignInput(noise(8).reshape(2, 2, 2), 16000, ["a"]), "shape"),
        (AlignInput(noise(399), 16000, ["a"]), "too short"),
        (AlignInput(noise(199), 8000, ["a"]), "too short"),
        (AlignInput(np.zeros(8000 * 21, dtype=np.float32), 8000, ["a"]), "at most 20.48 s"),
    ],
)
def test_bad_inputs_raise_align_input_error(aligner: ForcedAligner, item: AlignInput, message: str) -> None:
    with pytest.raises(AlignInputError, match=message):
        aligner.predict_classes([item])


def test_official_length_limit() -> None:
    with pytest.raises(AlignInputError, match="at most 180 s"):
        prepare_waveform(np.zeros(8000 * 181, dtype=np.float32), 8000)


def test_waveform_normalisation() -> None:
    x = noise(16000, scale=0.2)
    np.testing.assert_array_equal(prepare_waveform(x, 16000), x)  # in range: untouched
    loud = x * np.float32(7.0)
    np.testing.assert_array_equal(prepare_waveform(loud, 16000), loud / np.float32(np.abs(loud).max()))
    stereo = np.stack([x, -0.5 * x], axis=1)
    np.testing.assert_array_equal(prepare_waveform(stereo, 16000), stereo.mean(axis=1, dtype=np.float32))
    y = noise(24000)
    out = prepare_waveform(y, 24000)
    assert out.shape == (16000,)  # librosa's length fix: ceil(n * 16000 / 24000)
    np.testing.assert_array_equal(out, np.clip(resample(y, 24000, 16000), -1, 1))


@pytest.mark.parametrize("frames", [1, 7, 99, 100, 101, 250, 850, 1000])
def test_audio_token_count_matches_the_encoder(aligner: ForcedAligner, frames: int) -> None:
    features = torch.zeros(128, frames)
    assert aligner.thinker.audio_tower(features).shape == (audio_token_count(frames), 64)


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURE / "ckpt", dst)
    return dst


def _edit_json(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_loader_refuses_a_recogniser(tmp_path: Path) -> None:
    ckpt = _copy(tmp_path)
    _edit_json(ckpt / "config.json", lambda d: d["thinker_config"].update(model_type="qwen3_asr_thinker"))
    with pytest.raises(AlignerCheckpointError, match="not a forced aligner"):
        load_aligner(ckpt)


def test_loader_needs_extra_special_tokens(tmp_path: Path) -> None:
    ckpt = _copy(tmp_path)
    _edit_json(ckpt / "tokenizer_config.json", lambda d: d.pop("extra_special_tokens"))
    with pytest.raises(AlignerCheckpointError, match="extra_special_tokens"):
        load_aligner(ckpt)


def test_loader_checks_the_timestamp_id(tmp_path: Path) -> None:
    ckpt = _copy(tmp_path)
    _edit_json(ckpt / "config.json", lambda d: d.update(timestamp_token_id=d["timestamp_token_id"] - 1))
    with pytest.raises(AlignerCheckpointError, match="timestamp_token_id"):
        load_aligner(ckpt)


def test_loader_reports_missing_weights(tmp_path: Path) -> None:
    ckpt = _copy(tmp_path)
    state = load_file(str(ckpt / "model.safetensors"))
    del state["thinker.audio_tower.proj2.bias"]
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(AlignerCheckpointError, match=r"missing keys \['audio_tower.proj2.bias'\]"):
        load_aligner(ckpt)
    state["thinker.audio_tower.proj2.bias"] = torch.zeros(3)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(AlignerCheckpointError, match="size mismatch"):
        load_aligner(ckpt)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(AlignerCheckpointError, match="no model.safetensors"):
        load_aligner(ckpt)
    with pytest.raises(AlignerCheckpointError, match="does not exist"):
        load_aligner(tmp_path / "nothing")
