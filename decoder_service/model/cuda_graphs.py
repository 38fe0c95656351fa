"""Graph replay of ``CodecDecoder.step``: every (batch, frames) bucket captured at startup into one
memory pool (CUDA), or the same bookkeeping emulated eagerly (any device, for CPU CI).

``CodecDecoder.step`` with a ``lengths`` tensor has no host synchronisation and no data-dependent
shapes, and every state tensor has a fixed shape, so one (batch, frames) bucket is captured once
and replayed: inputs are copied into static buffers, the graph is replayed, outputs are cloned out
of the graph's static outputs (the next replay of any bucket may reuse that memory: one pool).
Capturing happens when :class:`CudaGraphSteps` is built (the decoder process builds it while
loading, before health reports SERVING), largest bucket first, through
:class:`tts_common.cuda_graphs.StepCapture`, which logs what it captured and what it cost.

**Bounded memory** (``memory_bound``, the decoder's ``--graph-memory``). An H200 run of the
release decoder held 7.7 GiB (bfloat16) / 9.5 GiB (float32) for all 42 default buckets, most of it
the activations of the largest buckets. With a bound, buckets are captured smallest first (by
rows x frames: the small, launch-bound steps are where a graph pays; the large ones are
compute-bound, 80-110 ms a chunk on that H200) while the memory held stays within the bound; a
bucket that would not fit is not captured and its steps run eagerly at the same padded shape
(exact: the same ``CodecDecoder.step`` with ``lengths``). What a bucket will hold is predicted
before its capture from its *counted* bytes (static inputs, and outputs: new state and audio),
scaled on CUDA by the ratio measured so far between the pool's growth and the counted bytes
(activations); in emulation nothing else is held, so the count is the measure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from tts_common.cuda_graphs import CapturedStep, CaptureMode, CaptureReport, StepCapture
from tts_common.memory import format_bytes

from .decoder import CodecDecoder
from .primitives import State

logger = logging.getLogger(__name__)


def _nbytes(tensors: object) -> int:
    """Bytes of the tensors in a (nested) tuple/list/dict."""
    if isinstance(tensors, Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(_nbytes(v) for v in tensors.values())
    if isinstance(tensors, (tuple, list)):
        return sum(_nbytes(v) for v in tensors)
    return 0


class _BatchBuffers:
    """Static inputs every frames bucket of one batch size shares: the streaming state (the
    largest static buffers: conv histories, attention windows) and the positions. Sharing is safe
    because :meth:`CudaGraphSteps.step` writes them before every replay and graphs never run
    concurrently; it keeps the static state at one copy per batch size instead of one per
    (batch, frames) bucket."""

    def __init__(self, decoder: CodecDecoder, batch: int) -> None:
        self.batch = batch
        self.positions = torch.zeros(batch, dtype=torch.long, device=decoder.device)
        self.state = decoder.init_state(batch)

    @property
    def nbytes(self) -> int:
        tensors = [self.positions, *self.state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


class _Bucket:
    """Static inputs of one (batch, frames) bucket and its step."""

    def __init__(self, decoder: CodecDecoder, frames: int, shared: _BatchBuffers) -> None:
        dev = decoder.device
        self.decoder = decoder
        batch = shared.batch
        self.codes = torch.zeros((batch, decoder.num_quantizers, frames), dtype=torch.long, device=dev)
        self.positions = shared.positions
        self.lengths = torch.full((batch,), frames, dtype=torch.long, device=dev)
        self.state = shared.state

    def run(self) -> tuple[Tensor, State]:
        return self.decoder.step(self.codes, self.positions, self.lengths, self.state)


class CudaGraphSteps:
    """One captured step per (batch, frames) bucket that fits ``memory_bound`` (all of them
    without a bound), all captured at construction; the other buckets' steps run eagerly."""

    def __init__(
        self,
        decoder: CodecDecoder,
        batch_buckets: Sequence[int],
        frame_buckets: Sequence[int],
        mode: CaptureMode = "cuda",
        memory_bound: int | None = None,
    ) -> None:
        if mode == "cuda" and decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a decoder on a cuda device")
        if memory_bound is not None and memory_bound < 0:
            raise ValueError(f"memory_bound must be >= 0 bytes, not {memory_bound}")
        self.decoder = decoder
        self.memory_bound = memory_bound
        shapes = [(b, n) for b in batch_buckets for n in frame_buckets]
        if memory_bound is None:  # largest first: the first capture sizes the pool
            shapes.sort(key=lambda s: (-s[0] * s[1], s))
        else:  # smallest first: keep the launch-bound buckets (see the module docstring)
            shapes.sort(key=lambda s: (s[0] * s[1], s))
        self._shared: dict[int, _BatchBuffers] = {}
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self.captured: dict[str, CapturedStep[tuple[Tensor, State]]] = {}
        self.skipped: list[tuple[int, int]] = []
        """Buckets not captured (they would not fit ``memory_bound``): their steps run eagerly."""
        self.static_bytes = 0
        """Device memory of the captured buckets' static inputs (outside the graphs' pool)."""
        self.held_bytes = 0
        """What the captured buckets hold: static inputs plus the pool's growth (CUDA) or the
        static outputs (emulated). ``memory_bound`` bounds this."""
        row_state = _nbytes(decoder.init_state(1))
        capture = StepCapture(decoder.device, mode)
        report = CaptureReport(mode)
        t0 = time.perf_counter()
        before = capture.reserved_bytes()
        if mode == "cuda":
            torch.cuda.reset_peak_memory_stats(decoder.device)
        counted = 0  # the captured buckets' counted bytes (static inputs and outputs)
        with torch.inference_mode():
            for b, n in shapes:
                static = b * (decoder.num_quantizers * n + 1) * 8  # codes, lengths
                if b not in self._shared:
                    static += b * (row_state + 8)  # the batch's shared state and positions
                cost = static + b * row_state + b * n * decoder.samples_per_frame * 4  # + outputs
                scale = max(1.0, self.held_bytes / counted) if counted else 1.0
                if memory_bound is not None and self.held_bytes + cost * scale > memory_bound:
                    self.skipped.append((b, n))
                    continue
                if b not in self._shared:
                    self._shared[b] = _BatchBuffers(decoder, b)
                shared = self._shared[b]
                bucket = self._buckets[(b, n)] = _Bucket(decoder, n, shared)
                name = self._name((b, n))
                self.captured[name] = capture.capture(name, bucket.run)
                report.names.append(name)
                counted += cost
                self.static_bytes = sum(x.nbytes for x in self._shared.values()) + sum(
                    x.codes.numel() * 8 + x.lengths.numel() * 8 for x in self._buckets.values()
                )
                if mode != "cuda":
                    self.held_bytes = self.static_bytes + sum(
                        _nbytes(c.outputs) for c in self.captured.values()
                    )
                elif memory_bound is not None:  # measure: a sync and an empty_cache per capture
                    self.held_bytes = self.static_bytes + max(0, capture.reserved_bytes() - before)
        if mode == "cuda":
            torch.cuda.synchronize(decoder.device)
            report.peak_bytes = max(0, torch.cuda.max_memory_reserved(decoder.device) - before)
        report.pool_bytes = max(0, capture.reserved_bytes() - before)
        if mode == "cuda":
            self.held_bytes = self.static_bytes + report.pool_bytes
        report.seconds = time.perf_counter() - t0
        self.report = report
        logger.info("decoder step: captured %s: %s", report.summary(), ", ".join(report.names))
        if memory_bound is not None:
            logger.info("decoder graphs: %s", self.describe_bound())
            if self.held_bytes > memory_bound:
                logger.warning(
                    "decoder graphs hold %.0f MiB, over --graph-memory %.0f MiB (the prediction was low)",
                    self.held_bytes / 2**20,
                    memory_bound / 2**20,
                )

    def describe_bound(self) -> str:
        """What the bound let in, for logs and ``doctor``."""
        bound = "no bound" if self.memory_bound is None else f"bound {format_bytes(self.memory_bound)}"
        eager = ", ".join(f"{b}x{n}" for b, n in self.skipped) or "none"
        return (
            f"{len(self.captured)} of {len(self.captured) + len(self.skipped)} buckets captured in "
            f"{format_bytes(self.held_bytes)} ({bound}); eager: {eager}"
        )

    @staticmethod
    def _name(shape: tuple[int, int]) -> str:
        return f"decoder[B={shape[0]},F={shape[1]}]"

    def step(self, codes: Tensor, positions: Tensor, lengths: Tensor, state: State) -> tuple[Tensor, State]:
        """Same contract as ``CodecDecoder.step`` (``lengths`` required): the captured graph of
        the shape's bucket, or the eager step for a bucket left out by the memory bound."""
        shape = (int(codes.shape[0]), int(codes.shape[-1]))
        bucket = self._buckets.get(shape)
        if bucket is None:
            if shape in self.skipped:
                return self.decoder.step(codes, positions, lengths, state)
            raise ValueError(f"no graph was captured for (batch, frames) = {shape}")
        bucket.codes.copy_(codes)
        bucket.positions.copy_(positions)
        bucket.lengths.copy_(lengths)
        for key, buf in bucket.state.items():
            buf.copy_(state[key])
        wav, new_state = self.captured[self._name(shape)].replay()
        # the static outputs are overwritten by the next replay: hand out copies
        return wav.clone(), {k: v.clone() for k, v in new_state.items()}
