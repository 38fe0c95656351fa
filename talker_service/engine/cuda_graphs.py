"""Whole-decode-step CUDA graphs, one per batch bucket (CUDA only; CPU runs the step eagerly).

What is static (captured once per bucket B):
  * the input buffers: slot index [B], trailing rows [B, H], Gumbel noise [B, V] and
    [B, G-1, V_cp] (zeros on greedy rows: ``choose_tokens`` then returns the greedy argmax);
  * a :class:`DecodeState` of B rows (positions, last code0, past hidden, repetition history,
    sampling parameters) that the step updates in place;
  * ``attend_len = max_seq_len``: every row reads its whole slot and masks keys past its own
    position, so one graph serves every sequence length;
  * the KV cache itself (the runner's buffers; graphs read and write it by slot index).
What is replayed: :func:`~talker_service.model.step.decode_step` — the talker forward for the new
frame, the code predictor's 15 forward passes and all sampling — with no host synchronisation.
Around each replay, on the host side: gather the active slots' rows into the static state
(padding rows point at a scratch slot), copy inputs in, replay, scatter the state back, and read
the step outputs (the one device->host copy per step).

This is a thin layer over the same static-shape step that the CPU tests exercise; it is written
and documented but could not be run on this project's CPU-only machines (see the test marked
``cuda``).
"""

from __future__ import annotations

import torch

from ..model.step import DecodeState, StepOutput, decode_step
from ..model.talker import KVCache, Talker
from .config import EngineConfig
from .slot_table import scatter_state


class _BucketGraph:
    """Static buffers and the captured graph of one batch bucket."""

    def __init__(
        self, talker: Talker, cache: KVCache, table: DecodeState, config: EngineConfig, batch: int
    ) -> None:
        self.batch = batch
        param = next(talker.parameters())
        dev, dtype = param.device, param.dtype
        cfg = talker.cfg
        cp = cfg.code_predictor
        self.scratch_slot = config.max_slots  # the extra slot allocated for padding rows
        self.index = torch.full((batch,), self.scratch_slot, dtype=torch.int64, device=dev)
        self.trailing = torch.zeros(batch, cfg.hidden_size, dtype=dtype, device=dev)
        self.talker_noise = torch.zeros(batch, cfg.vocab_size, dtype=torch.float32, device=dev)
        self.cp_noise = torch.zeros(
            batch, cp.num_code_groups - 1, cp.vocab_size, dtype=torch.float32, device=dev
        )
        self.state: DecodeState = table.rows(self.index)
        self.state.slots = self.index
        self.graph = torch.cuda.CUDAGraph()
        self.out: StepOutput | None = None
        attend_len = config.max_seq_len

        def run() -> StepOutput:
            return decode_step(
                talker, cache, self.state, self.trailing, attend_len, self.talker_noise, self.cp_noise
            )

        # Warm up on a side stream (allocator + lazy init), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph):
            self.out = run()


class CudaGraphStep:
    """Replays the captured decode step for the smallest bucket holding the active rows."""

    def __init__(self, talker: Talker, cache: KVCache, table: DecodeState, config: EngineConfig) -> None:
        self.talker, self.cache, self.table, self.config = talker, cache, table, config
        self._graphs: dict[int, _BucketGraph] = {}

    def _graph(self, bucket: int) -> _BucketGraph:
        if bucket not in self._graphs:
            self._graphs[bucket] = _BucketGraph(self.talker, self.cache, self.table, self.config, bucket)
        return self._graphs[bucket]

    def step(
        self,
        index: torch.Tensor,
        trailing: torch.Tensor,
        talker_noise: torch.Tensor | None,
        cp_noise: torch.Tensor | None,
    ) -> StepOutput:
        """One decode step for the rows of slots ``index`` (same contract as the eager step)."""
        n = index.shape[0]
        g = self._graph(self.config.bucket_for(n))
        g.index.fill_(g.scratch_slot)
        g.index[:n] = index
        scatter_state(g.state, torch.arange(g.batch, device=index.device), self.table.rows(g.index))
        g.trailing.zero_()
        g.trailing[:n] = trailing
        g.talker_noise.zero_()
        g.cp_noise.zero_()
        if talker_noise is not None:
            g.talker_noise[:n] = talker_noise
        if cp_noise is not None:
            g.cp_noise[:n] = cp_noise
        g.graph.replay()
        scatter_state(self.table, index, g.state.rows(torch.arange(n, device=index.device)))
        assert g.out is not None
        return StepOutput(
            frame_codes=g.out.frame_codes[:n].clone(),
            next_code0=g.out.next_code0[:n].clone(),
            is_eos=g.out.is_eos[:n].clone(),
        )
