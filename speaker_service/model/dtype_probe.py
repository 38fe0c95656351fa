"""The speaker stage's step for ``--dtype auto`` on CPU (:mod:`tts_common.auto_dtype`): one
reference request, a fixed synthetic clip through the checkpoint's own voice-clone front end
loaded in each dtype (the speaker embedding, then the reference codes).

That is what the server runs for one reference (``SpeakerServicer._compute`` less the decoding
of the request's bytes, which no dtype changes): the ECAPA speaker encoder's convolutions after a
float32 log-mel, then the Mimi encoder's convolutions, transformer and residual quantizers. The
whole request is timed, not its convolutions alone, since on a CPU without bf16 arithmetic the
bfloat16 convolutions may run emulated while the transformer's linears are faster: only the
measurement says which wins. The stage runs references one at a time on its compute thread, so
one row is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tts_common.auto_dtype import OneDtypeAtATime, StepProbe, speech_like_clip

from .frontend import VoiceCloneFrontEnd

CLIP_SECONDS = 5.0
"""Length of the timed reference: a typical voice-clone reference (3 to 10 s)."""
BUCKETS = (1,)
"""Rows timed: the server computes one reference at a time (a single compute thread, no
batching), so more rows would only be that step again."""


def speaker_step_probe(
    load: Callable[[torch.dtype], VoiceCloneFrontEnd],
    what: str,
    seconds: float = CLIP_SECONDS,
    buckets: tuple[int, ...] = BUCKETS,
) -> StepProbe:
    """``rows`` references of ``seconds`` each, one after another as the server runs them;
    ``load(dtype)`` gives the front end in a dtype (called once per dtype, then one untimed
    reference warms it up: Mimi builds its codebooks on first use)."""

    def request(frontend: VoiceCloneFrontEnd, audio: np.ndarray) -> None:
        with torch.inference_mode():
            frontend.embed(audio)
            frontend.encode_reference(audio)

    def warmed(dtype: torch.dtype) -> VoiceCloneFrontEnd:
        frontend = load(dtype)
        request(frontend, speech_like_clip(frontend.sample_rate, seconds))
        return frontend

    frontends = OneDtypeAtATime(warmed)

    def step_seconds(dtype: str, rows: int) -> float:
        frontend = frontends(dtype)
        audio = speech_like_clip(frontend.sample_rate, seconds)
        t0 = time.perf_counter()
        for _ in range(rows):
            request(frontend, audio)
        return time.perf_counter() - t0

    return StepProbe("speaker", what, step_seconds, buckets)


def _idle_step(dtype: str, rows: int) -> float:
    return 0.0


def checkpoint_speaker_probe(model_dir: str | Path) -> StepProbe:
    """:func:`speaker_step_probe` of the checkpoint's front end (its weights, on CPU).

    A checkpoint that is not a Base one has no speaker encoder: the stage serves no voice cloning
    from it (it answers unavailable), so there is nothing to time and the step takes no time in
    either dtype, which keeps float32."""
    from tts_common.config import load_checkpoint_config

    cfg = load_checkpoint_config(model_dir)
    spk = cfg.model.speaker_encoder
    if spk is None:
        what = f"nothing (a {cfg.model.tts_model_type!r} checkpoint has no speaker encoder)"
        return StepProbe("speaker", what, _idle_step, BUCKETS)
    st = cfg.speech_tokenizer
    mimi = st.encoder_config
    what = (
        f"one {CLIP_SECONDS:g} s reference at {st.input_sample_rate} Hz (speaker encoder: "
        f"{spk.mel_dim} mels, channels {'/'.join(map(str, spk.enc_channels))}, embedding "
        f"{spk.enc_dim}; codec encoder: {mimi.get('num_filters')} filters downsampling "
        f"{'x'.join(map(str, mimi.get('upsampling_ratios', [])))}, {mimi.get('num_hidden_layers')} "
        f"layers of {mimi.get('hidden_size')}, {st.encoder_valid_num_quantizers} quantizers)"
    )
    return speaker_step_probe(lambda dtype: VoiceCloneFrontEnd.from_checkpoint(model_dir, "cpu", dtype), what)


__all__ = ["BUCKETS", "CLIP_SECONDS", "checkpoint_speaker_probe", "speaker_step_probe"]
