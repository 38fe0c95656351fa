"""The decoder's graph-path self-check, and building its batcher through it.

``decoder.graph_vs_eager``: for each (batch, frames) bucket checked, that many streams advance two
chunks of that many random frames through the captured steps (static state carried between the
chunks) and alone through the eager step; the audio must agree within the dtype's tolerance
(different matmul shapes only). ``short=True`` (startup) checks the smallest and the largest
bucket; ``qwen3-tts doctor`` checks all. :func:`start_batcher` applies ``--cuda-graphs`` through
:func:`tts_common.self_check.choose_graph_path`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tts_common import metrics
from tts_common.self_check import (
    CheckFailedError,
    GraphPathOutcome,
    SelfCheckReport,
    check_graph_device,
    choose_graph_path,
)

from .decoder import CodecDecoder
from .streaming import DecoderSession, SessionBatcher

Check = tuple[str, Callable[[], dict[str, Any] | None]]


def graph_tolerance(dtype: torch.dtype, device: torch.device, tf32: bool) -> float:
    """How far, relative to the audio's peak, the graph step may be from the solo eager step.

    The two run different shapes (the graph pads to its bucket), so the kernels may differ:
    float32 agrees to rounding on the CPU, but on CUDA with TF32 allowed (``tf32``: cuDNN's
    default for convolutions) each product rounds its inputs to 10 mantissa bits, and padded
    and unpadded shapes pick different algorithms. An H200 run of float32 buckets measured
    1.3e-3 of the peak, which the CPU's 1e-4 would have refused (a needless fallback to eager).
    A real fault (state not carried, a wrong row, a stale buffer) is off by the audio itself.
    """
    if dtype != torch.float32:
        return 5e-2
    if device.type == "cuda" and tf32:
        return 1e-2
    return 1e-4


def _tf32_allowed() -> bool:
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


def verify_bucket(batcher: SessionBatcher, batch: int, frames: int, seed: int = 0) -> float:
    """Graph path against solo eager streams for one bucket; the largest relative difference."""
    decoder = batcher.decoder
    gen = torch.Generator(device="cpu").manual_seed(seed)
    codes = [
        torch.randint(0, decoder.config.codebook_size, (2 * frames, decoder.num_quantizers), generator=gen)
        for _ in range(batch)
    ]
    graphed = [DecoderSession(decoder) for _ in range(batch)]
    solo = [DecoderSession(decoder) for _ in range(batch)]
    worst = 0.0
    for chunk in range(2):
        pieces = [c[chunk * frames : (chunk + 1) * frames] for c in codes]
        outs = batcher.advance(graphed, pieces)
        for row, (session, piece, out) in enumerate(zip(solo, pieces, outs)):
            ref = session.feed(piece).float()
            if out.shape != ref.shape:
                raise CheckFailedError(
                    f"bucket (B={batch}, F={frames}) row {row}: {tuple(out.shape)} samples, not {tuple(ref.shape)}"
                )
            scale = max(float(ref.abs().max()), 1e-3)
            worst = max(worst, float((out.float() - ref).abs().max()) / scale)
    weight = next(decoder.parameters())
    tolerance = graph_tolerance(weight.dtype, weight.device, _tf32_allowed())
    if not worst <= tolerance:  # NaN fails too
        raise CheckFailedError(
            f"graph step of bucket (B={batch}, F={frames}) differs from eager by {worst:.3g} of the "
            f"audio's peak (> {tolerance})"
        )
    return worst


def graph_checks(batcher: SessionBatcher, *, short: bool) -> list[Check]:
    """The decoder's checks of ``batcher``'s captured steps (see the module docstring)."""
    shapes = [(b, f) for b in batcher.batch_buckets for f in batcher.frame_buckets]
    if short:
        shapes = sorted({shapes[0], shapes[-1]})

    def graph_vs_eager() -> dict[str, Any]:
        worst = max(verify_bucket(batcher, b, f, seed=i) for i, (b, f) in enumerate(shapes))
        return {"buckets": [list(s) for s in shapes], "max_rel_diff": worst}

    return [("decoder.graph_vs_eager", graph_vs_eager)]


def start_batcher(
    decoder: CodecDecoder, choice: str, emulate: bool = False, **buckets: Any
) -> tuple[SessionBatcher, GraphPathOutcome]:
    """The decoder's batcher: with its graphs captured and self-checked where they apply (a cuda
    device and ``choice`` not off, or ``emulate``), else eager. ``choice``: ``--cuda-graphs``."""
    check_graph_device(choice, decoder.device, emulated=emulate)
    on_cuda = decoder.device.type == "cuda"
    if not emulate and (not on_cuda or choice == "off"):
        metrics.GRAPH_PATH.labels(stage="decoder").set(0)
        return SessionBatcher(decoder, use_cuda_graphs=False, **buckets), GraphPathOutcome(
            None, SelfCheckReport("decoder")
        )

    def build() -> SessionBatcher:
        return SessionBatcher(decoder, use_cuda_graphs=not emulate, emulate_cuda_graphs=emulate, **buckets)

    outcome = choose_graph_path("decoder", choice, build, lambda b: graph_checks(b, short=True))
    batcher = outcome.graphs or SessionBatcher(decoder, use_cuda_graphs=False, **buckets)
    metrics.GRAPH_PATH.labels(stage="decoder").set(int(outcome.graphs is not None))
    return batcher, outcome


__all__ = ["graph_checks", "start_batcher", "verify_bucket"]
