"""Model-facing half of the talker engine: static KV slots, per-slot decode state, one step.

The runner owns a :class:`~talker_service.model.talker.KVCache` with ``max_slots`` slots and a
*slot table*: a :class:`~talker_service.model.step.DecodeState` with one row per slot (positions,
last code0, past hidden state, repetition-penalty history, sampling parameters). A decode step
gathers the rows of the active slots, runs :func:`~talker_service.model.step.decode_step` on
them (talker forward + the code predictor's 15 steps + sampling) and scatters the new state back.

CPU: the step runs eagerly with exactly the active rows and ``attend_len = max(position) + 1``,
which is bit-identical to running each request alone (tests check it). CUDA: the same function
is captured once per batch bucket as a CUDA graph (:mod:`.cuda_graphs`), with padded rows and a
static ``attend_len``.
"""

from __future__ import annotations

import torch

from ..model.sampling import RequestNoise, SamplingTensors, step_noise
from ..model.step import StepOutput, decode_step, prefill
from ..model.talker import Talker
from .config import EngineConfig
from .kv_memory import allocate_kv_cache
from .request import EngineRequest
from .slot_table import allocate_table, scatter_state


class TalkerRunner:
    """Prefill and batched decode over static slots for one loaded talker."""

    def __init__(self, talker: Talker, config: EngineConfig) -> None:
        self.talker = talker
        self.config = config
        param = next(talker.parameters())
        self.device, self.dtype = param.device, param.dtype
        use_graphs = self.device.type == "cuda" and config.use_cuda_graphs
        # CUDA graphs pad batches to a bucket: padding rows write into one extra scratch slot.
        num_slots = config.max_slots + (1 if use_graphs else 0)
        # Lazily committed on CPU: positions no request reaches cost no memory (kv_memory.py).
        self.cache = allocate_kv_cache(talker.cfg, num_slots, config.max_seq_len, self.device, self.dtype)
        self.table = allocate_table(talker, num_slots, self.device, self.dtype)
        cp = talker.cfg.code_predictor
        self.cp_steps = cp.num_code_groups - 1
        self.cp_vocab = cp.vocab_size
        self._graphs = None
        if use_graphs:
            from .cuda_graphs import CudaGraphStep  # CUDA only

            self._graphs = CudaGraphStep(talker, self.cache, self.table, config)

    @property
    def kv_bytes_per_slot(self) -> int:
        """Talker K+V bytes one slot holds (code-predictor caches are per step and tiny)."""
        return 2 * self.cache.k[:, 0].numel() * self.cache.k.element_size()

    def prefill(self, request: EngineRequest) -> None:
        """Write the request's prompt into its slot and choose code0 of frame 0."""
        assert request.slot is not None and request.prompt is not None
        request.noise = RequestNoise(
            request.sampling, self.talker.cfg.vocab_size, self.cp_vocab, self.cp_steps, self.device
        )
        params = SamplingTensors.stack([request.sampling], self.device)
        noise = request.noise.talker() if request.sampling.do_sample else None
        embeds = request.prompt.prefill.to(self.device, self.dtype)
        state = prefill(self.talker, self.cache, request.slot, embeds, params, noise)
        scatter_state(self.table, torch.tensor([request.slot], device=self.device), state)

    def _trailing_rows(self, requests: list[EngineRequest]) -> torch.Tensor:
        """[B, H]: each row's next trailing text embedding, or tts_pad once exhausted."""
        rows = [r.prompt.trailing_row(r.frames_emitted) for r in requests]  # type: ignore[union-attr]
        return torch.stack(rows).to(self.device, self.dtype)

    def step(self, requests: list[EngineRequest]) -> StepOutput:
        """One decode step for ``requests`` (each in its slot); outputs on the model device."""
        index = torch.tensor([r.slot for r in requests], device=self.device, dtype=torch.int64)
        trailing = self._trailing_rows(requests)
        noises = [r.noise for r in requests]
        assert all(n is not None for n in noises), "noise streams are created at prefill"
        talker_noise, cp_noise = step_noise(noises)  # type: ignore[arg-type]
        if self._graphs is not None:
            return self._graphs.step(index, trailing, talker_noise, cp_noise)
        rows = self.table.rows(index)
        slots = [r.slot for r in requests]
        # Rows in slots 0..B-1 (the common case, see Scheduler) read the cache through views;
        # otherwise K/V are gathered and scattered by slot index.
        rows.slots = None if slots == list(range(len(slots))) else index
        # Host-side bookkeeping gives the longest attended prefix without a device sync.
        attend_len = max(r.prompt_len + r.frames_emitted for r in requests) + 1
        out = decode_step(self.talker, self.cache, rows, trailing, attend_len, talker_noise, cp_noise)
        scatter_state(self.table, index, rows)
        return out
