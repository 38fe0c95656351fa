"""The aligner's step for ``--dtype auto`` on CPU (:mod:`tts_common.auto_dtype`): one batched
forward pass, :meth:`ForcedAligner.predict_classes` of a fixed synthetic clip and a short English
sentence per row, through the checkpoint's own aligner loaded in each dtype.

That is what the batcher runs on the compute thread for a batch of Align calls: the features and
prompt ids (float32 numpy whatever the dtype), the audio tower's convolutions and transformer, the
Qwen3 text model and the timestamp classifier. The whole pass is timed, as the decoder's is: on a
CPU without bf16 arithmetic the bfloat16 convolutions may run emulated while the linears read half
the bytes, and only the measurement says which wins. The batcher joins up to ``--max-batch-size``
(8 by default) concurrent calls in one pass, so 1 and 8 rows are timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from tts_common.auto_dtype import OneDtypeAtATime, StepProbe, speech_like_clip

from .aligner import ForcedAligner
from .config import ForcedAlignerConfig
from .frontend import SAMPLE_RATE, AlignInput
from .loader import load_aligner

CLIP_SECONDS = 4.0
"""Length of each row's audio: a short utterance, as a streamed sentence is."""
WORDS = "the quick brown fox jumps over the lazy dog".split()
"""Each row's text (nine words, so eighteen ``<timestamp>`` positions)."""


def aligner_step_probe(
    load: Callable[[torch.dtype], ForcedAligner],
    what: str,
    buckets: tuple[int, ...] = (1, 8),
    seconds: float = CLIP_SECONDS,
    words: list[str] = WORDS,
) -> StepProbe:
    """One forward pass of ``rows`` utterances of ``seconds`` and ``words``; ``load(dtype)``
    gives the aligner in a dtype (called once per dtype). Each (dtype, rows) is run once untimed
    before its first timing."""
    item = AlignInput(
        audio=speech_like_clip(SAMPLE_RATE, seconds), sample_rate=SAMPLE_RATE, words=list(words)
    )
    # The aligner of a dtype and the row counts it has run (a fresh set with each load).
    aligners = OneDtypeAtATime(lambda dtype: (load(dtype), set[int]()))

    def step_seconds(dtype: str, rows: int) -> float:
        aligner, warm = aligners(dtype)
        batch = [item] * rows
        if rows not in warm:
            aligner.predict_classes(batch)
            warm.add(rows)
        t0 = time.perf_counter()
        aligner.predict_classes(batch)
        return time.perf_counter() - t0

    return StepProbe("aligner", what, step_seconds, buckets)


def checkpoint_aligner_probe(model_dir: str | Path) -> StepProbe:
    """:func:`aligner_step_probe` of the aligner checkpoint at ``model_dir`` (its weights, on CPU)."""
    config = ForcedAlignerConfig.from_checkpoint(model_dir)
    audio, text = config.audio, config.text
    what = (
        f"a {CLIP_SECONDS:g} s utterance of {len(WORDS)} words per row (audio tower: convolutions of "
        f"{audio.downsample_hidden_size}, {audio.encoder_layers} layers of {audio.d_model}, "
        f"feed-forward {audio.encoder_ffn_dim}; text model: {text.num_hidden_layers} layers of "
        f"{text.hidden_size}, intermediate {text.intermediate_size}; {config.classify_num} classes)"
    )
    return aligner_step_probe(lambda dtype: load_aligner(model_dir, device="cpu", dtype=dtype), what)


__all__ = ["CLIP_SECONDS", "WORDS", "aligner_step_probe", "checkpoint_aligner_probe"]
