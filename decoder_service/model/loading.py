"""Loading the speech-tokenizer decoder from a checkpoint (the one way serving gets a decoder)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tts_common.config import SpeechTokenizerConfig, load_checkpoint_config
from tts_common.weights import load_module_weights

from .convolutions import SnakeBeta
from .decoder import CodecDecoder

CHECKPOINT_PREFIX = "decoder."
"""Key prefix of the decoder's tensors in ``speech_tokenizer/model.safetensors``."""
AUDIO_TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 0.1, torch.float16: 0.03}
"""Relative RMS error of a reduced-precision decoder's audio against float32 that the tests hold
it to (the measured figures are in :func:`load_codec_decoder`)."""


def load_codec_decoder(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CodecDecoder:
    """Load from a model directory (with ``speech_tokenizer/``) or a speech-tokenizer directory.

    Strict: every ``decoder.*`` tensor must match a parameter/buffer and vice versa. ``dtype``
    float32 (default, like the official loader without ``dtype``), bfloat16 or float16 (SnakeBeta
    stays float32). Returns the decoder on ``device`` in eval mode.

    Reduced precision against float32, measured on the fixture checkpoints' codes (random
    weights, peaks ~0.45): bfloat16 audio is within a relative RMS error of 0.074 (SNR >= 22.7
    dB, largest sample error 0.041); float16 within 0.022 (SNR >= 33.3 dB, 0.013).
    ``tests/unit/decoder/test_precision.py`` pins :data:`AUDIO_TOLERANCE`.
    """
    root = Path(path)
    if (root / "speech_tokenizer" / "config.json").is_file():
        st_dir = root / "speech_tokenizer"
        config = load_checkpoint_config(root).speech_tokenizer
    else:
        st_dir = root
        with open(root / "config.json", encoding="utf-8") as fh:
            config = SpeechTokenizerConfig.from_dict(json.load(fh))
    decoder = CodecDecoder(config.decoder).to(device=device, dtype=dtype)
    if dtype != torch.float32:
        _snake_params_float32(decoder)
    # One read of the file, each tensor copied into its parameter's dtype: SnakeBeta's float32.
    load_module_weights(decoder, st_dir / "model.safetensors", CHECKPOINT_PREFIX)
    return decoder.eval()


def _snake_params_float32(decoder: CodecDecoder) -> None:
    """Make every SnakeBeta's parameters float32 (it computes in float32 at any model dtype, see
    its docstring), so that they take their stored values, not their rounding to the model
    dtype."""
    for module in decoder.modules():
        if isinstance(module, SnakeBeta):
            for param in ("alpha", "beta"):
                value = getattr(module, param).detach().to(torch.float32)
                setattr(module, param, torch.nn.Parameter(value, requires_grad=False))
