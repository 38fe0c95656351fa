"""The decoder's step for ``--dtype auto`` on CPU (:mod:`tts_common.auto_dtype`): one streamed
chunk of every session in a batch, through the checkpoint's own decoder loaded in each dtype.

The whole step is timed, not its convolutions alone: on a CPU without bf16 arithmetic the
bfloat16 convolutions, transposed convolutions and SnakeBeta activations run emulated, about ten
times slower than float32 (a 2-core AVX2-only AMD EPYC, 0.6B: 5188 against 518 ms a 4-frame
chunk), while on one with AVX512-BF16 or AMX they can be faster. Only the measurement says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from tts_common.auto_dtype import OneDtypeAtATime, StepProbe

from .decoder import CodecDecoder
from .loading import load_codec_decoder
from .streaming import DecoderSession, advance_sessions

STEP_FRAMES = 4
"""Frames of the timed chunk: one that a stream's early chunks reach, kept short because an
emulated bf16 step takes about a second per frame per row."""


def decoder_step_probe(
    load: Callable[[torch.dtype], CodecDecoder],
    what: str,
    buckets: tuple[int, ...] = (1, 8),
    frames: int = STEP_FRAMES,
) -> StepProbe:
    """A chunk of ``frames`` frames for each of ``rows`` sessions, after a first chunk that fills
    their left context; ``load(dtype)`` gives the decoder in a dtype (called once per dtype)."""
    decoders = OneDtypeAtATime(load)

    def step_seconds(dtype: str, rows: int) -> float:
        decoder = decoders(dtype)
        gen = torch.Generator().manual_seed(rows)
        shape = (frames, decoder.num_quantizers)

        def chunks() -> list[torch.Tensor]:
            return [torch.randint(0, decoder.config.codebook_size, shape, generator=gen) for _ in range(rows)]

        sessions = [DecoderSession(decoder) for _ in range(rows)]
        with torch.inference_mode():
            advance_sessions(sessions, chunks())
            step = chunks()
            t0 = time.perf_counter()
            advance_sessions(sessions, step)
            return time.perf_counter() - t0

    return StepProbe("decoder", what, step_seconds, buckets)


def checkpoint_decoder_probe(model_dir: str | Path) -> StepProbe:
    """:func:`decoder_step_probe` of the checkpoint's decoder (its weights, on CPU)."""
    from tts_common.config import load_checkpoint_config

    config = load_checkpoint_config(model_dir).speech_tokenizer.decoder
    what = (
        f"a {STEP_FRAMES}-frame chunk per session (decoder: {config.num_hidden_layers} layers of "
        f"{config.hidden_size}, convolutions of {config.decoder_dim} upsampling "
        f"{'x'.join(map(str, config.upsampling_ratios + config.upsample_rates))})"
    )
    return decoder_step_probe(lambda dtype: load_codec_decoder(model_dir, "cpu", dtype), what)


__all__ = ["STEP_FRAMES", "checkpoint_decoder_probe", "decoder_step_probe"]
