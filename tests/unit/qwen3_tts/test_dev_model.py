"""The dev checkpoint's configs: tiny by default, the released dimensions for 0b6 / 1b7 (random
weights at real size, for benchmarks), the same token ids either way."""

from __future__ import annotations

import pytest

from qwen3_tts.dev_model import MODEL_TYPES, dev_model_config, dev_speech_tokenizer_config
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
