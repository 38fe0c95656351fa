"""The dev checkpoint's configs: tiny by default, the released dimensions for 0b6 / 1b7 (random
weights at real size, for benchmarks), the same token ids either way; and how it is written (into
its folder, which may be a volume's mount point, config.json last)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qwen3_tts.dev_model import MODEL_TYPES, dev_model_config, dev_speech_tokenizer_config, make_dev_model
from tts_common.config import Qwen3TTSConfig, SpeechTokenizerConfig
from tts_common.release_dims import release_decoder_config, release_model_config


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("size", ["0b6", "1b7"])
def test_release_sizes_have_release_dims_and_dev_token_ids(model_type: str, size: str) -> None:
    dev = Qwen3TTSConfig.from_dict(dev_model_config(model_type))
    big = Qwen3TTSConfig.from_dict(dev_model_config(model_type, size))
    release = release_model_config(size, model_type)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads", "head_dim"):
        assert getattr(big.talker, key) == getattr(release.talker, key), key
        assert getattr(big.talker.code_predictor, key) == getattr(release.talker.code_predictor, key), key
    assert big.talker.text_vocab_size == release.talker.text_vocab_size
    assert big.tts_model_size == size and big.tts_model_type == model_type
    # The text ids come from the shipped compact vocabulary, as in the tiny dev checkpoint.
    assert (big.tts_pad_token_id, big.im_start_token_id) == (dev.tts_pad_token_id, dev.im_start_token_id)
    assert (
        big.talker.spk_id == dev.talker.spk_id
        and big.talker.codec_eos_token_id == dev.talker.codec_eos_token_id
    )
    st = SpeechTokenizerConfig.from_dict(dev_speech_tokenizer_config(size))
    assert st.decoder == release_decoder_config()


def test_unknown_size_is_refused() -> None:
    with pytest.raises(ValueError, match="size must be one of"):
        dev_model_config("custom_voice", "7b")


def test_the_checkpoint_fills_its_folder_and_never_replaces_it(tmp_path: Path) -> None:
    """The folder may be a volume's mount point (the image's /models/checkpoint), which cannot be
    removed or renamed over: the files land in that very folder (same inode, and a descriptor
    opened before sees them), a second write replaces them in place, and no staging is left."""
    root = tmp_path / "checkpoint"
    root.mkdir()
    (root / "keep.txt").write_text("an operator's note")
    inode = root.stat().st_ino
    handle = os.open(root, os.O_RDONLY)
    try:
        for _ in range(2):
            make_dev_model(root, "custom_voice")
            assert root.stat().st_ino == inode
            seen = set(os.listdir(handle))
            assert {"config.json", "model.safetensors", "speech_tokenizer", "keep.txt"} <= seen
            assert not [name for name in seen if name.startswith(".dev-model-")]
    finally:
        os.close(handle)
    Qwen3TTSConfig.from_dict(json.loads((root / "config.json").read_text()))
    # readable by every user (the image's processes run as uid 10001, whoever made the checkpoint)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in root.rglob("*") if p.is_file() and p.name != "keep.txt"
    }
    assert set(modes.values()) == {0o644}, modes


def test_an_interrupted_write_leaves_no_config_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.json is what marks a checkpoint present (``--if-missing``, the image's
    entrypoint): a write that fails part-way leaves none, so the next start writes it again."""
    root = tmp_path / "checkpoint"
    make_dev_model(root, "base")
    real_replace = os.replace

    def fail_on_the_tokenizer(source: str | Path, target: str | Path) -> None:
        if Path(target).name == "model.safetensors" and Path(target).parent.name == "speech_tokenizer":
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", fail_on_the_tokenizer)
    with pytest.raises(OSError, match="No space left"):
        make_dev_model(root, "custom_voice")
    assert not (root / "config.json").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".dev-model-")]
    monkeypatch.undo()
    assert make_dev_model(root, "custom_voice", if_missing=True) == root
    assert json.loads((root / "dev_model.json").read_text())["type"] == "custom_voice"
