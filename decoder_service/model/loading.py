"""Loading the speech-tokenizer decoder from a checkpoint (the one way serving gets a decoder)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tts_common.config import SpeechTokenizerConfig, load_checkpoint_config
from tts_common.weights import load_module_weights

from .decoder import CodecDecoder

CHECKPOINT_PREFIX = "decoder."
"""Key prefix of the decoder's tensors in ``speech_tokenizer/model.safetensors``."""


def load_codec_decoder(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CodecDecoder:
    """Load from a model directory (with ``speech_tokenizer/``) or a speech-tokenizer directory.

    Strict: every ``decoder.*`` tensor must match a parameter/buffer and vice versa. ``dtype``
    float32 (default, like the official loader without ``dtype``) or bfloat16. Returns the decoder
    on ``device`` in eval mode.
    """
    root = Path(path)
    if (root / "speech_tokenizer" / "config.json").is_file():
        st_dir = root / "speech_tokenizer"
        config = load_checkpoint_config(root).speech_tokenizer
    else:
        st_dir = root
        with open(root / "config.json", encoding="utf-8") as fh:
            config = SpeechTokenizerConfig.from_dict(json.load(fh))
    decoder = CodecDecoder(config.decoder)
    load_module_weights(decoder, st_dir / "model.safetensors", CHECKPOINT_PREFIX, dtype=dtype)
    return decoder.to(device=device, dtype=dtype).eval()
