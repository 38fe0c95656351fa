"""Graph replay of ``CodecDecoder.step``: every (batch, frames) bucket captured at startup into one
memory pool (CUDA), or the same bookkeeping emulated eagerly (any device, for CPU CI).

``CodecDecoder.step`` with a ``lengths`` tensor has no host synchronisation and no data-dependent
shapes, and every state tensor has a fixed shape, so one (batch, frames) bucket is captured once
and replayed: inputs are copied into static buffers, the graph is replayed, outputs are cloned out
of the graph's static outputs (the next replay of any bucket may reuse that memory: one pool).
Capturing happens when :class:`CudaGraphSteps` is built (the decoder process builds it while
loading, before health reports SERVING), largest bucket first, through
:class:`tts_common.cuda_graphs.StepCapture`, which logs what it captured and what it cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tts_common.cuda_graphs import CapturedStep, CaptureMode, StepCapture

from .decoder import CodecDecoder
from .primitives import State


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
    """One captured step per (batch, frames) bucket, all captured at construction."""

    def __init__(
        self,
        decoder: CodecDecoder,
        batch_buckets: Sequence[int],
        frame_buckets: Sequence[int],
        mode: CaptureMode = "cuda",
    ) -> None:
        if mode == "cuda" and decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a decoder on a cuda device")
        self.decoder = decoder
        shapes = sorted(
            ((b, n) for b in batch_buckets for n in frame_buckets), key=lambda s: (-s[0] * s[1], s)
        )
        shared = {b: _BatchBuffers(decoder, b) for b in sorted(set(batch_buckets))}
        self._buckets = {(b, n): _Bucket(decoder, n, shared[b]) for b, n in shapes}
        self.static_bytes = sum(x.nbytes for x in shared.values()) + sum(
            b.codes.numel() * b.codes.element_size() + b.lengths.numel() * 8 for b in self._buckets.values()
        )
        """Device memory of the static inputs (outside the graphs' pool): count it with the pool."""
        with torch.inference_mode():
            self.captured, self.report = StepCapture(decoder.device, mode).capture_all(
                [(self._name(shape), self._buckets[shape].run) for shape in shapes], "decoder step"
            )
        self.captured: dict[str, CapturedStep[tuple[Tensor, State]]]

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
