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
the activations of the largest batches. With a bound, whole batch sizes (every frames bucket of
one batch size) are captured smallest first while what the graphs hold stays within the bound;
the larger batch sizes are dropped from the buckets (:attr:`CudaGraphSteps.batch_buckets`), so
``SessionBatcher`` runs a larger group as several captured steps (rows are independent: exact),
never as an eager step whose activations would escape the bound. On that H200 the large steps are
compute-bound (8x25 frames 26 ms, 32x25 91 ms, float32), so splitting 32 streams into groups of 8
costs about 15% of those steps' time. What a batch size will hold is predicted before its capture:
its *counted* bytes (static inputs; outputs: new state and audio), and on CUDA at least the
previous batch size's measured pool growth scaled by the batch ratio (activations grow with the
batch); in emulation nothing else is held, so the count is the measure.
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
    """One captured step per (batch, frames) bucket, all captured at construction; with
    ``memory_bound`` only the batch sizes that fit (see the module docstring)."""

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
        batches, frames = sorted(set(batch_buckets)), sorted(set(frame_buckets))
        self._shared: dict[int, _BatchBuffers] = {}
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self.captured: dict[str, CapturedStep[tuple[Tensor, State]]] = {}
        self.batch_buckets: tuple[int, ...] = ()
        """The batch sizes captured (every frames bucket of each)."""
        self.left_out: tuple[int, ...] = ()
        """Batch sizes not captured (over ``memory_bound``): their groups run as smaller steps."""
        self.held_bytes = 0
        """What the graphs hold: static inputs plus the pool's growth (CUDA) or the static
        outputs (emulated). ``memory_bound`` bounds it."""
        capture = StepCapture(decoder.device, mode)
        report = CaptureReport(mode)
        t0 = time.perf_counter()
        before = capture.reserved_bytes()
        if mode == "cuda":
            torch.cuda.reset_peak_memory_stats(decoder.device)
        row_state = _nbytes(decoder.init_state(1))
        spf = decoder.samples_per_frame
        with torch.inference_mode():
            if memory_bound is None:  # largest first: the first capture sizes the pool
                shapes = sorted(((b, n) for b in batches for n in frames), key=lambda s: (-s[0] * s[1], s))
                self._capture(capture, report, shapes)
                self.batch_buckets = tuple(batches)
            else:
                last: tuple[int, int] | None = None  # (batch, what capturing it added)
                for i, b in enumerate(batches):
                    # the batch's shared state and positions; per frames bucket: codes, lengths,
                    # and the outputs (a new state, the float32 audio)
                    counted = b * (row_state + 8) + sum(
                        b * ((decoder.num_quantizers * n + 1) * 8 + row_state + n * spf * 4) for n in frames
                    )
                    predicted = counted if last is None else max(counted, last[1] * b // last[0])
                    if self.held_bytes + predicted > memory_bound:
                        self.left_out = tuple(batches[i:])
                        break
                    held = self.held_bytes
                    self._capture(capture, report, [(b, n) for n in reversed(frames)])
                    self.batch_buckets += (b,)
                    self.held_bytes = self._held(capture, before)
                    last = (b, self.held_bytes - held)
        if mode == "cuda":
            torch.cuda.synchronize(decoder.device)
            report.peak_bytes = max(0, torch.cuda.max_memory_reserved(decoder.device) - before)
        self.held_bytes = self._held(capture, before)
        # the static inputs are allocated during the loop (outside the pool): report the pool alone
        report.pool_bytes = max(0, self.held_bytes - self.static_bytes) if mode == "cuda" else 0
        report.seconds = time.perf_counter() - t0
        self.report = report
        logger.info("decoder step: captured %s: %s", report.summary(), ", ".join(report.names))
        if memory_bound is not None:
            log = logger.warning if self.held_bytes > memory_bound or not self.captured else logger.info
            log("decoder graphs: %s", self.describe_bound())

    @property
    def static_bytes(self) -> int:
        """Device memory of the static inputs (outside the graphs' pool): count it with the pool."""
        return sum(x.nbytes for x in self._shared.values()) + sum(
            _nbytes(x.codes) + _nbytes(x.lengths) for x in self._buckets.values()
        )

    def _capture(self, capture: StepCapture, report: CaptureReport, shapes: list[tuple[int, int]]) -> None:
        for b, n in shapes:
            if b not in self._shared:
                self._shared[b] = _BatchBuffers(self.decoder, b)
            bucket = self._buckets[(b, n)] = _Bucket(self.decoder, n, self._shared[b])
            name = self._name((b, n))
            self.captured[name] = capture.capture(name, bucket.run)
            report.names.append(name)

    def _held(self, capture: StepCapture, before: int) -> int:
        if capture.mode == "cuda":  # the growth holds the static inputs too; a sync and an empty_cache
            return max(self.static_bytes, capture.reserved_bytes() - before)
        return self.static_bytes + sum(_nbytes(c.outputs) for c in self.captured.values())

    def describe_bound(self) -> str:
        """What the bound let in, for logs and ``doctor``."""
        bound = "no bound" if self.memory_bound is None else f"bound {format_bytes(self.memory_bound)}"
        kept = ",".join(map(str, self.batch_buckets)) or "none"
        out = f"batch sizes {kept} captured ({len(self.captured)} buckets) in {format_bytes(self.held_bytes)} ({bound})"
        if self.left_out:
            how = f"as groups of {self.batch_buckets[-1]}" if self.batch_buckets else "eagerly"
            out += f"; batch sizes {','.join(map(str, self.left_out))} left out (run {how})"
        return out

    @staticmethod
    def _name(shape: tuple[int, int]) -> str:
        return f"decoder[B={shape[0]},F={shape[1]}]"

    def step(self, codes: Tensor, positions: Tensor, lengths: Tensor, state: State) -> tuple[Tensor, State]:
        """Same contract as ``CodecDecoder.step`` (``lengths`` required; the shape must be a
        captured bucket)."""
        shape = (int(codes.shape[0]), int(codes.shape[-1]))
        bucket = self._buckets.get(shape)
        if bucket is None:
            raise ValueError(f"no graph was captured for (batch, frames) = {shape}")
        bucket.codes.copy_(codes)
        bucket.positions.copy_(positions)
        bucket.lengths.copy_(lengths)
        for key, buf in bucket.state.items():
            buf.copy_(state[key])
        wav, new_state = self.captured[self._name(shape)].replay()
        # the static outputs are overwritten by the next replay: hand out copies
        return wav.clone(), {k: v.clone() for k, v in new_state.items()}
