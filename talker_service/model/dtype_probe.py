"""The talker's step for ``--dtype auto`` on CPU (:mod:`tts_common.auto_dtype`): the linears of
one decode frame of the checkpoint's own dimensions (the talker's layers and codec head once, the
code predictor's layers and heads once per codebook after the first), each dtype with the kernels
``--linear auto`` keeps for it (:mod:`tts_common.kernels.choice`).

On CPU the linears are the talker's step: one frame streams every weight, and the attention over
a short context, the norms and the sampling are a few percent of it (``bench/cpu_serving.py``
profiles a frame). They are timed on random weights of the checkpoint's shapes, many copies per
shape so none stays in a cache, as the kernel choice times them; the kernel table measured here is
the one the engine then loads from the cache.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tts_common.auto_dtype import StepProbe
from tts_common.config import TalkerConfig, load_checkpoint_config
from tts_common.kernels.candidates import family_kernels
from tts_common.kernels.choice import KernelTable, frame_linear_calls, measure_kernels


def talker_step_probe(
    talker: TalkerConfig, quantization: str = "none", buckets: tuple[int, ...] = (1, 8)
) -> StepProbe:
    """The linears of one decode frame of ``talker``, timed per dtype at ``buckets`` rows; with
    ``quantization`` int8 the int8 kernels that take activations in that dtype (``--dtype``
    then sets the activations only)."""
    calls = frame_linear_calls(talker)
    tables: dict[str, KernelTable] = {}

    def step_seconds(dtype: str, rows: int) -> float:
        if dtype not in tables:  # every bucket measured at once, then from the table
            family = "int8" if quantization == "int8" else dtype
            kernels = family_kernels(family, getattr(torch, dtype))
            tables[dtype] = measure_kernels(calls, family, buckets, kernels=kernels)
        return tables[dtype].step_seconds(calls, rows)

    streamed = sum(fan_in * fan_out * n for (fan_in, fan_out, _), n in calls.items())
    shapes = ", ".join(f"{n}x {i}->{o}{'+bias' if b else ''}" for (i, o, b), n in sorted(calls.items()))
    weights = "int8 weights, " if quantization == "int8" else ""
    what = f"linears of a decode frame ({weights}{streamed / 1e6:.1f}M weights streamed: {shapes})"
    return StepProbe("talker", what, step_seconds, buckets)


def checkpoint_talker_probe(model_dir: str | Path, quantization: str = "none") -> StepProbe:
    """:func:`talker_step_probe` of the talker of the checkpoint at ``model_dir``."""
    return talker_step_probe(load_checkpoint_config(model_dir).model.talker, quantization)


__all__ = ["checkpoint_talker_probe", "talker_step_probe"]
