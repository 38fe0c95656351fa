"""``--dtype auto`` on CPU: each stage times its own step in float32 and in bfloat16 and keeps
bfloat16 only where it is faster over the batch sizes timed and slower at none of them (beyond
timing noise, :data:`NOISE`), never by CPU flags alone.

Flags do not tell: on a CPU without bf16 arithmetic (AVX2, or AVX-512 without AVX512-BF16) one
stage's step can still be faster in bfloat16 and another's slower. On a 2-core AVX2-only AMD
EPYC (Zen 3), 0.6B: the talker's decode step, bound by memory, takes 137 ms in bfloat16 against
224 in float32 at one row and 282 against 382 at eight (half the bytes; our GEMV widens the
weights as it loads them), while the decoder's bf16 convolutions are emulated, 5188 ms a 4-frame
chunk against 518; with int8 weights the talker's bf16 activations cost more than they save (89
against 80 ms at one row). On an AVX512-BF16 EPYC (Zen 4) the int8 step ties at one row (56.6
against 56.7 ms) and is 1.4x as fast in bfloat16 at eight (114 against 162). So the choice is per
stage, on that stage's own whole step (:class:`StepProbe`, written next to each stage's model).
The timings are cached per CPU (model name, generation and flags), torch version and thread
count (:func:`probe_cache_path`), so only a machine's first start measures."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

from .kernels.cache import load_json, machine_cache_file, store_json

logger = logging.getLogger(__name__)

ModelT = TypeVar("ModelT")

CANDIDATES = ("float32", "bfloat16")
"""The dtypes ``auto`` chooses between on CPU (float16 has no fast CPU path)."""
ROUNDS = 3
"""Times each (dtype, rows) step is timed at most; the best is kept."""
NOISE = 0.05
"""How much slower than float32 a bfloat16 step may time at one row count and still count as not
slower: within what one machine's best-of-:data:`ROUNDS` timings of one step move between
starts (a tie, such as the Zen 4 int8 step's at one row, is otherwise decided by the noise)."""
DECISIVE = 2.0
"""How many times slower than float32 a bfloat16 step must be to be timed only once (no burst
of load doubles a step time; an emulated bf16 step can take seconds)."""


@dataclass(frozen=True)
class StepProbe:
    """One stage's step, timed at a dtype and a number of rows."""

    stage: str
    """The stage measured (talker, decoder, speaker, aligner), for the log and the cache key."""

    what: str
    """What one step is, with every dimension its time depends on (part of the cache key: a
    different checkpoint size is measured again)."""

    step_seconds: Callable[[str, int], float]
    """Seconds of one step in a dtype (a name of :data:`CANDIDATES`) at a number of rows (streams
    batched together). Called up to :data:`ROUNDS` times per pair, every float32 pair before any
    bfloat16 one: set-up (loading the model in a dtype) is the probe's to keep between calls,
    and only the last dtype's need be kept."""

    buckets: tuple[int, ...] = (1, 8)
    """The row counts timed; bfloat16 is kept only where it is faster over them all and not
    slower at any one (beyond :data:`NOISE`), so ``auto`` is never slower than float32 at any of
    them (rows past the first where it is slower are not timed)."""

    @property
    def key(self) -> str:
        """The cache key: stage, step, rows and the thread count it was timed on."""
        rows = "/".join(map(str, self.buckets))
        return f"{self.stage}: {self.what}; rows {rows}; {torch.get_num_threads()} threads"


class OneDtypeAtATime(Generic[ModelT]):
    """A probe's model, held for one dtype at a time: ``load(dtype)`` runs on the first call of
    a dtype, after the previous dtype's model is dropped (:func:`measured_cpu_dtype` times one
    dtype after the other, so each loads once and only one is held)."""

    def __init__(self, load: Callable[[torch.dtype], ModelT]) -> None:
        self._load = load
        self._held: tuple[str, ModelT] | None = None

    def __call__(self, dtype: str) -> ModelT:
        """The model in ``dtype`` (a name of :data:`CANDIDATES`)."""
        if self._held is None or self._held[0] != dtype:
            self._held = None  # dropped before the next one loads
            self._held = (dtype, self._load(getattr(torch, dtype)))
        return self._held[1]


def speech_like_clip(sample_rate: int, seconds: float) -> np.ndarray:
    """A deterministic speech-like mono float32 clip in [-1, 1] for a probe's step: gliding
    harmonics under an envelope, plus noise (a step's time depends on the clip's length, not on
    what it holds)."""
    rng = np.random.default_rng(0)
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    phase = 2 * np.pi * np.cumsum(140.0 + 40.0 * np.sin(2 * np.pi * 0.7 * t)) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 2.3 * t) ** 2
    return (0.2 * envelope * voiced + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def probe_cache_path() -> Path:
    """The file of this CPU model and torch version that keeps every probe's timings."""
    return machine_cache_file("auto-dtype")


def _bf16_ratios(times: dict[str, dict[int, float]], buckets: tuple[int, ...]) -> list[float]:
    """bfloat16's time over float32's at each row count (inf where bfloat16 was not timed; a
    probe with nothing to time gives 0 for both: a ratio of 1, not faster)."""
    ratios = []
    for b in buckets:
        bf16, fp32 = times["bfloat16"].get(b, float("inf")), times["float32"][b]
        ratios.append(bf16 / fp32 if fp32 > 0 else 1.0 if bf16 <= 0 else float("inf"))
    return ratios


def _not_slower(ratios: list[float]) -> bool:
    return all(r <= 1 + NOISE for r in ratios)


def _bf16_kept(times: dict[str, dict[int, float]], buckets: tuple[int, ...]) -> bool:
    """Faster over the row counts (the mean of the ratios below 1) and slower at none."""
    ratios = _bf16_ratios(times, buckets)
    return _not_slower(ratios) and sum(ratios) < len(ratios)


def _timings(probe: StepProbe) -> dict[str, dict[int, float]]:
    """Seconds per step by dtype and rows, from the cache or measured and cached.

    One dtype at a time, float32 first (so a probe need hold one dtype's model: a talker's
    float32 and bfloat16 weights together would take one and a half times its float32 size), rows
    from fewest to most, each timed :data:`ROUNDS` times, the best kept. bfloat16 stops at the
    first rows where it is slower (beyond :data:`NOISE`): the choice is float32 then, and an
    emulated bf16 step can take seconds (the decoder's, on a CPU without bf16 arithmetic), so a
    step :data:`DECISIVE` times slower than float32's is not timed again.
    """
    path = probe_cache_path()
    cached = load_json(path).get(probe.key)
    try:
        return {d: {int(b): float(t) for b, t in cached[d].items()} for d in CANDIDATES}
    except (TypeError, KeyError, ValueError, AttributeError):
        pass
    times: dict[str, dict[int, float]] = {d: {} for d in CANDIDATES}
    t0 = time.perf_counter()
    for d in CANDIDATES:
        for b in sorted(probe.buckets):
            for _ in range(ROUNDS):
                times[d][b] = min(times[d].get(b, float("inf")), probe.step_seconds(d, b))
                if d == "bfloat16" and times[d][b] > DECISIVE * times["float32"][b]:
                    break
            if d == "bfloat16" and not _not_slower(_bf16_ratios(times, (b,))):
                break
    logger.info("--dtype auto on CPU, %s: measured in %.1f s", probe.stage, time.perf_counter() - t0)
    data = load_json(path)  # re-read: another stage may have stored its own meanwhile
    data[probe.key] = {d: {str(b): t for b, t in by_rows.items()} for d, by_rows in times.items()}
    store_json(path, data)
    return times


def measured_cpu_dtype(probe: StepProbe) -> str:
    """``--dtype auto`` of one stage on CPU: bfloat16 where ``probe``'s step is faster in
    bfloat16 than in float32 over the row counts it times and slower at none of them (beyond
    :data:`NOISE`), else float32 (logged with the times)."""
    times = _timings(probe)
    pick = "bfloat16" if _bf16_kept(times, probe.buckets) else "float32"

    def ms(d: str) -> str:
        return "/".join(f"{1e3 * times[d][b]:.1f}" if b in times[d] else "-" for b in probe.buckets)

    logger.info(
        "--dtype auto on CPU, %s: %s (%s; ms per step at rows %s: float32 %s, bfloat16 %s)",
        probe.stage,
        pick,
        probe.what,
        "/".join(map(str, probe.buckets)),
        ms("float32"),
        ms("bfloat16"),
    )
    return pick


__all__ = [
    "CANDIDATES",
    "DECISIVE",
    "NOISE",
    "OneDtypeAtATime",
    "ROUNDS",
    "StepProbe",
    "measured_cpu_dtype",
    "probe_cache_path",
    "speech_like_clip",
]
