"""The speech tokenizer fingerprint (tts_common.fingerprint): equal for the same codec however its
files were saved, different as soon as a weight or a setting differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.fixtures import CKPT_DIR
from tts_common.fingerprint import reported_fingerprint, speech_tokenizer_fingerprint


def _copy(tmp_path: Path, name: str = "copy") -> Path:
    """A copy of tiny_base's speech tokenizer in ``tmp_path / name``."""
    target = tmp_path / name
    shutil.copytree(CKPT_DIR / "tiny_base" / "speech_tokenizer", target / "speech_tokenizer")
    return target


def test_every_fixture_checkpoint_shares_one_codec() -> None:
    prints = {speech_tokenizer_fingerprint(path) for path in sorted(CKPT_DIR.iterdir()) if path.is_dir()}
    assert len(prints) == 1 and len(prints.pop()) == 64


def test_resaving_the_same_weights_keeps_the_fingerprint(tmp_path: Path) -> None:
    original = _copy(tmp_path)
    before = speech_tokenizer_fingerprint(original)
    weights = original / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(weights)
    resaved = _copy(tmp_path, "resaved")
    target = resaved / "speech_tokenizer" / "model.safetensors"
    # Reversed insertion order and other metadata; a dtype key in the config.
    save_file(dict(reversed(list(tensors.items()))), str(target), metadata={"saved_by": "someone else"})
    config = resaved / "speech_tokenizer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"dtype": "bfloat16"}))
    assert speech_tokenizer_fingerprint(resaved) == before


def test_a_changed_weight_or_setting_changes_the_fingerprint(tmp_path: Path) -> None:
    before = speech_tokenizer_fingerprint(_copy(tmp_path))
    weights_changed = _copy(tmp_path, "weights")
    path = weights_changed / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[len(tensors) // 2]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += torch.ones((), dtype=tensors[name].dtype)
    save_file(tensors, str(path))
    config_changed = _copy(tmp_path, "config")
    config = config_changed / "speech_tokenizer" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"output_sample_rate": 16000}))
    prints = {
        before,
        speech_tokenizer_fingerprint(weights_changed),
        speech_tokenizer_fingerprint(config_changed),
    }
    assert len(prints) == 3


def test_a_checkpoint_without_a_speech_tokenizer_reports_none(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        speech_tokenizer_fingerprint(tmp_path)
    assert reported_fingerprint(tmp_path) == ""
