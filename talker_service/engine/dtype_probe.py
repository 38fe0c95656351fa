"""The talker's step for ``--dtype auto`` on CPU (:mod:`tts_common.auto_dtype`): one whole
decode step (code predictor, talker, sampling with a default request's settings) of every row
of a batch, through the checkpoint's own talker loaded in each dtype with the kernels the engine
would run (``--linear`` and ``--quantization``: the fused layer stacks included).

The whole step, not its linears alone: on a 2-core AVX2-only AMD EPYC (Zen 3), 0.6B, the
linears timed one shape at a time made bfloat16 slower than float32 at eight rows (418 against
401 ms), while the engine's step, whose fused stacks also read a bf16 KV cache, runs 8 rows in
282 ms in bfloat16 against 382 in float32. And with the kernels the engine would choose: chosen
for rows 1 and 8 only instead of the engine's 1, 2, 4, 8 and 16, some float32 shapes went to
oneDNN, which left the layers unfused and the float32 step at 442 ms instead of 224. The dtypes
are timed one after the other, each talker loaded once and dropped before the next (at the first
start only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tts_common.auto_dtype import OneDtypeAtATime, StepProbe
from tts_common.config import load_checkpoint_config
from tts_common.kernels.choice import set_up_linears
from tts_common.synthesis import SamplingParams

from ..model.loader import TalkerModel
from ..model.sampling import SamplingTensors, gumbel_from_uniform_, split_step_noise, step_noise_width
from ..model.step import DecodeState, decode_step, prefill
from .config import EngineConfig

PROMPT_POSITIONS = 32
"""Cached positions of each row before the timed steps (a short prompt)."""
ROOM = 256
"""Decode steps a runner may take before it fills its cache and prefills again."""


def decode_step_runner(
    model: TalkerModel,
    rows: int,
    steps: int = 1,
    prompt: int = PROMPT_POSITIONS,
    sampling: SamplingParams | None = None,
) -> Callable[[], None]:
    """A closure running ``steps`` decode steps over ``rows`` rows, each prefilled with
    ``prompt`` random embeddings (prefilled again once its cache is full), choosing as
    ``sampling`` says (default greedy; a sampling one draws each step's Gumbel noise, as the
    engine does)."""
    cfg = model.config.model.talker
    hidden, cp_steps, cp_vocab = (
        cfg.hidden_size,
        cfg.code_predictor.num_code_groups - 1,
        cfg.code_predictor.vocab_size,
    )
    gen = torch.Generator().manual_seed(0)
    cache = model.allocate_cache(rows, prompt + ROOM + 1)
    sampling = sampling or SamplingParams.greedy()
    params = SamplingTensors.stack([sampling], model.device)
    trailing = torch.zeros(rows, hidden, dtype=model.dtype)
    width = step_noise_width(cfg.vocab_size, cp_vocab, cp_steps)
    state: DecodeState | None = None

    def noise() -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A step's Gumbel noise of each stage that samples, for every row."""
        if not (sampling.do_sample or sampling.subtalker_do_sample):
            return None, None
        talker, code_predictor = split_step_noise(
            gumbel_from_uniform_(torch.empty(rows, width).uniform_(generator=gen)), cp_steps, cp_vocab
        )
        return (talker if sampling.do_sample else None), (
            code_predictor if sampling.subtalker_do_sample else None
        )

    def start() -> DecodeState:
        with torch.inference_mode():
            prompts = [torch.randn(prompt, hidden, generator=gen) * 0.02 for _ in range(rows)]
            first = noise()[0]
            states = [
                prefill(
                    model.talker,
                    cache,
                    slot,
                    p.to(model.dtype),
                    params,
                    None if first is None else first[slot],
                )
                for slot, p in enumerate(prompts)
            ]
        joined = DecodeState.cat(states)
        joined.slots = None  # rows are slots 0..rows-1
        return joined

    def run() -> None:
        nonlocal state
        if state is None or int(state.positions.max()) + steps >= prompt + ROOM:
            state = start()
        for _ in range(steps):
            talker_noise, cp_noise = noise()
            decode_step(
                model.talker, cache, state, trailing, int(state.positions.max()) + 1, talker_noise, cp_noise
            )

    return run


def talker_step_probe(
    load: Callable[[torch.dtype], TalkerModel],
    what: str,
    engine: EngineConfig,
    buckets: tuple[int, ...] = (1, 8),
) -> StepProbe:
    """One decode step at each of ``buckets`` rows; ``load(dtype)`` gives the talker in a dtype
    (called once per dtype), whose linears are then set up as the ``engine`` sets them up (its
    ``--linear``, ``--quantization`` and batch buckets: the kernel chosen for a shape depends on
    the buckets it is chosen for, and the fused stacks on every layer getting our GEMV). Each
    (dtype, rows) runs once untimed first."""

    def warmed(dtype: torch.dtype) -> dict[int, Callable[[], None]]:
        model = load(dtype)
        set_up_linears(
            model.talker, "cpu", model.dtype, engine.linear, engine.quantization, engine.graph_buckets
        )
        runs = {b: decode_step_runner(model, b, sampling=SamplingParams()) for b in buckets}
        for run in runs.values():
            run()  # first touch of the weights and the cache, lazy set-up
        return runs

    runners = OneDtypeAtATime(warmed)

    def step_seconds(dtype: str, rows: int) -> float:
        run = runners(dtype)[rows]
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    return StepProbe("talker", what, step_seconds, buckets)


def _dims(layers: Any) -> str:
    """The dimensions a decoder stack's step time depends on (a ``TalkerConfig`` or its
    ``CodePredictorConfig``)."""
    return (
        f"{layers.num_hidden_layers} layers of {layers.hidden_size}, intermediate {layers.intermediate_size}, "
        f"heads {layers.num_attention_heads}/{layers.num_key_value_heads}x{layers.head_dim}, vocab {layers.vocab_size}"
    )


def checkpoint_talker_probe(model_dir: str | Path, engine: EngineConfig | None = None) -> StepProbe:
    """:func:`talker_step_probe` of the checkpoint's talker (its weights, on CPU) in an engine
    of ``engine``'s settings (default: the talker stage's defaults), at 1 row and at 8 (or its
    slots, if fewer)."""
    engine = engine or EngineConfig()
    talker = load_checkpoint_config(model_dir).model.talker
    kernels = f"--linear {engine.linear} --quantization {engine.quantization} for rows {engine.graph_buckets}"
    what = f"a decode step ({kernels}; talker {_dims(talker)}; code predictor {_dims(talker.code_predictor)})"
    buckets = tuple(sorted({1, min(8, engine.max_slots)}))
    return talker_step_probe(
        lambda dtype: TalkerModel.from_checkpoint(model_dir, "cpu", dtype), what, engine, buckets
    )


__all__ = ["PROMPT_POSITIONS", "ROOM", "checkpoint_talker_probe", "decode_step_runner", "talker_step_probe"]
