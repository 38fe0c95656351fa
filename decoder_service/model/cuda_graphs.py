"""Optional CUDA-graph replay of ``CodecDecoder.step`` (cuda only; a thin layer over the eager step).

``CodecDecoder.step`` with a ``lengths`` tensor has no host synchronisation and no data-dependent
shapes, and every state tensor has a fixed shape, so one (batch, frames) bucket can be captured
once and replayed: inputs are copied into static buffers, the graph is replayed, outputs are
cloned out of the graph's static outputs. Used by ``streaming.SessionBatcher`` when the decoder
lives on a cuda device; CPU never comes here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .decoder import CodecDecoder
from .primitives import State


class _CapturedStep:
    """One captured step for a fixed (batch, frames) shape."""

    def __init__(self, decoder: CodecDecoder, batch: int, frames: int, pool: object, warmup: int = 2) -> None:
        dev = decoder.device
        self.codes = torch.zeros((batch, decoder.num_quantizers, frames), dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.lengths = torch.full((batch,), frames, dtype=torch.long, device=dev)
        self.state = decoder.init_state(batch)
        stream = torch.cuda.Stream(device=dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):  # warm-up off the capture (allocator, kernels, codebook cache)
            for _ in range(warmup):
                decoder.step(self.codes, self.positions, self.lengths, self.state)
        torch.cuda.current_stream(dev).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.wav, self.new_state = decoder.step(self.codes, self.positions, self.lengths, self.state)

    def __call__(
        self, codes: Tensor, positions: Tensor, lengths: Tensor, state: State
    ) -> tuple[Tensor, State]:
        self.codes.copy_(codes)
        self.positions.copy_(positions)
        self.lengths.copy_(lengths)
        for key, buf in self.state.items():
            buf.copy_(state[key])
        self.graph.replay()
        # the static outputs are overwritten by the next replay: hand out copies
        return self.wav.clone(), {k: v.clone() for k, v in self.new_state.items()}


class CudaGraphSteps:
    """Lazily captured graphs, one per (batch, frames) bucket, sharing one memory pool."""

    def __init__(self, decoder: CodecDecoder) -> None:
        if decoder.device.type != "cuda":
            raise ValueError("CUDA graphs need a decoder on a cuda device")
        self.decoder = decoder
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int], _CapturedStep] = {}

    def step(self, codes: Tensor, positions: Tensor, lengths: Tensor, state: State) -> tuple[Tensor, State]:
        """Same contract as ``CodecDecoder.step`` (``lengths`` required)."""
        key = (int(codes.shape[0]), int(codes.shape[-1]))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = _CapturedStep(self.decoder, key[0], key[1], self._pool)
        return graph(codes, positions, lengths, state)
