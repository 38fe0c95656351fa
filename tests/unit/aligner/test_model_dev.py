"""The dev aligner checkpoint (``make up``'s default): written in the released layout, loads
through load_aligner, and predicts timestamps that vary across the words."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aligner_service.model import AlignInput, load_aligner
from qwen3_tts.dev_aligner import DEV_CLASSIFY_NUM, DEV_K, make_dev_aligner

RELEASED_FILES = {
    "config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "preprocessor_config.json",
}


@pytest.fixture(scope="module")
def dev_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dev_aligner(tmp_path_factory.mktemp("dev") / "aligner")


def test_dev_aligner_layout(dev_path: Path) -> None:
    assert RELEASED_FILES <= {p.name for p in dev_path.iterdir()}
    assert not [p for p in dev_path.iterdir() if p.name.startswith(".dev-aligner-")]  # staging removed
    config = json.loads((dev_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_asr"
    assert config["thinker_config"]["model_type"] == "qwen3_forced_aligner"
    before = (dev_path / "model.safetensors").stat().st_mtime_ns
    assert make_dev_aligner(dev_path, seed=99, if_missing=True) == dev_path
    assert (dev_path / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dev_aligner_loads_and_predicts(dev_path: Path, dtype: torch.dtype) -> None:
    aligner = load_aligner(dev_path, dtype=dtype)
    assert aligner.num_classes == DEV_CLASSIFY_NUM and aligner.dtype == dtype
    assert aligner.max_audio_seconds == 180.0  # the official limit (5000 classes reach 400 s)
    rng = np.random.default_rng(3)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    audio = (rng.standard_normal(24000 * 3) * 0.2).astype(np.float32)  # 3 s at 24 kHz
    (classes,) = aligner.predict_classes([AlignInput(audio, 24000, words)])
    assert len(classes) == 2 * len(words)
    assert all(0 <= c < DEV_CLASSIFY_NUM for c in classes)
    assert len(set(classes)) >= 4  # the structure spreads the words out
    # a word every 2 * DEV_K classes (400 ms), up to the random part of the weights
    assert abs(classes[-1] - 2 * len(words) * DEV_K) <= 3
    assert classes[0] <= 2 * DEV_K
