"""Model-facing half of the talker engine: static KV slots, per-slot decode state, one step.

The runner owns a :class:`~talker_service.model.talker.KVCache` with ``max_slots`` slots, a
*slot table* (:mod:`.slot_table`: one :class:`~talker_service.model.step.DecodeState` row per slot)
and a per-slot *noise table* ``[max_slots, K, W]``: each sampling request draws K decode steps of
Gumbel noise at once into its slot's rows (:class:`~talker_service.model.sampling.RequestNoise`).
The scheduler keeps running requests in slots 0..n-1 and calls :meth:`TalkerRunner.move_slot`
when one moves down to fill a hole.

Two step paths, one step function (:func:`~talker_service.model.step.decode_step`):

* eager (CPU by default): exactly the decoding rows, ``attend_len = max(position) + 1``, masked
  SDPA over views of the cache — bit-identical to running each request alone (the official
  parity fixtures run here);
* graph (:mod:`.cuda_graphs`; CUDA graphs on CUDA, or their CPU emulation with
  ``EngineConfig.emulate_cuda_graphs``): one static step per batch bucket B over slots 0..B-1,
  captured at startup, reading the cache in place with per-row lengths
  (:mod:`~talker_service.model.decode_attention`).

Prefill is eager on both paths: the requests admitted in one engine iteration are prefilled
together (:meth:`TalkerRunner.prefill`), in as few forwards as :func:`forward_groups` allows,
each forward padding its prompts to the longest
(:func:`~talker_service.model.step.prefill_prompts`). A request's prefill is bit-identical to its
prompt prefilled alone wherever its decode step is batch-invariant: on CPU with the engine's
kernels, whose rows do not depend on the row count (checked at 1-336 rows and 2-16 threads on
the dev EPYC, release shapes; the prompts' own attention, norms and RoPE are per row); with
kernels whose rows depend on their batch (torch's float32 ``F.linear`` under ``--linear torch``,
cuBLAS on CUDA) the prefill, like the decode step, may differ from running alone in the last
bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model.sampling import RequestNoise, SamplingTensors, split_step_noise, step_noise_width
from ..model.step import StepOutput, decode_step, prefill_prompts
from ..model.talker import KVCache, Talker
from .config import EngineConfig
from .cuda_graphs import GraphStep, graph_mode
from .kv_memory import kv_bytes_per_position
from .request import EngineRequest
from .slot_table import allocate_table, move_row, scatter_state


class TalkerRunner:
    """Prefill and batched decode over static slots for one loaded talker."""

    def __init__(self, talker: Talker, config: EngineConfig, capture: bool = True) -> None:
        """``capture`` False: leave :attr:`graphs` None even where the graph path applies (the
        engine builds it through its self-check, :func:`.self_check.start_graph_path`)."""
        self.talker = talker
        self.config = config
        param = next(talker.parameters())
        self.device, self.dtype = param.device, param.dtype
        # Lazily committed on CPU: positions no request reaches cost no memory (kv_memory.py).
        self.cache = KVCache.allocate(
            talker.cfg, config.max_slots, config.max_seq_len, self.device, self.dtype
        )
        self.table = allocate_table(talker, config.max_slots, self.device, self.dtype)
        cp = talker.cfg.code_predictor
        self.cp_steps = cp.num_code_groups - 1
        self.cp_vocab = cp.vocab_size
        width = step_noise_width(talker.cfg.vocab_size, self.cp_vocab, self.cp_steps)
        self.noise_table = torch.zeros(
            config.max_slots, config.noise_steps_per_draw, width, dtype=torch.float32, device=self.device
        )
        """[slot, K, W]: the next K decode steps of Gumbel noise of the slot's request."""
        self.graphs: GraphStep | None = None
        if capture:
            self.graphs = self.build_graphs()

    def build_graphs(self) -> GraphStep | None:
        """The graph path for this runner's buffers, every bucket captured now (before the process
        reports SERVING), or None where it does not apply (``graph_mode``)."""
        mode = graph_mode(self.config, self.device)
        if mode is None:
            return None
        return GraphStep(self.talker, self.cache, self.table, self.noise_table, self.config, mode)

    @property
    def kv_bytes_per_slot(self) -> int:
        """Talker K+V bytes one slot holds (code-predictor caches are per step and tiny)."""
        return self.cache.max_len * kv_bytes_per_position(self.talker.cfg, self.dtype)

    def prefill(self, requests: Sequence[EngineRequest]) -> None:
        """Write the prompts of ``requests`` (each in its slot) into the cache and choose code0
        of frame 0 of each: few forwards for the whole group (:func:`forward_groups`, each
        :func:`~talker_service.model.step.prefill_prompts`), with the group's sampling
        parameters and noise stacked once and its slot-table rows written with one scatter."""
        for request in requests:
            assert request.slot is not None and request.prompt is not None
            request.noise = RequestNoise(
                request.sampling,
                self.talker.cfg.vocab_size,
                self.cp_vocab,
                self.cp_steps,
                self.device,
                steps_per_draw=self.config.noise_steps_per_draw,
            )
        for rows in forward_groups([r.prompt_len for r in requests]):
            group = [requests[i] for i in rows]
            params = SamplingTensors.stack([r.sampling for r in group], self.device)
            noise = None
            if any(r.sampling.do_sample for r in group):
                noise = torch.stack([r.noise.talker() for r in group])  # type: ignore[union-attr]
            prompts = [r.prompt.prefill.to(self.device, self.dtype) for r in group]  # type: ignore[union-attr]
            slots = [r.slot for r in group]
            state = prefill_prompts(self.talker, self.cache, slots, prompts, params, noise)  # type: ignore[arg-type]
            scatter_state(self.table, state.slots, state)  # type: ignore[arg-type]

    def move_slot(self, request: EngineRequest, src: int, dst: int) -> None:
        """The scheduler moved ``request`` from slot ``src`` to ``dst``: copy its KV prefix, its
        slot-table row and its noise rows (the scheduler's ``on_move``)."""
        # Host bookkeeping bounds the written prefix without a device sync (+1: the position a
        # request waiting for text may already have written).
        self.cache.copy_slot(src, dst, request.prompt_len + request.frames_emitted + 1)
        move_row(self.table, src, dst)
        self.noise_table[dst].copy_(self.noise_table[src])

    def _trailing_rows(self, requests: list[EngineRequest]) -> torch.Tensor:
        """[B, H]: each row's next trailing text embedding, or tts_pad once exhausted."""
        rows = [r.prompt.trailing_row(r.frames_emitted) for r in requests]  # type: ignore[union-attr]
        return torch.stack(rows).to(self.device, self.dtype)

    def _noise_rows(self, requests: list[EngineRequest]) -> list[int]:
        """Per request, the row of its slot's noise table holding this step's noise (drawing the
        next K steps first when used up; greedy requests never draw)."""
        rows = []
        for r in requests:
            assert r.noise is not None and r.slot is not None, "noise streams are created at prefill"
            rows.append(r.noise.next_step(self.noise_table[r.slot]) if r.noise.samples else 0)
        return rows

    def step(self, requests: list[EngineRequest]) -> StepOutput:
        """One decode step for ``requests`` (each in its slot); outputs on the model device, one
        row per request in the given order."""
        slots = [r.slot for r in requests]
        trailing = self._trailing_rows(requests)
        noise_rows = self._noise_rows(requests)
        if self.graphs is not None:
            sampling = any(r.noise is not None and r.noise.samples for r in requests)
            return self.graphs.step(slots, trailing, noise_rows, sampling)  # type: ignore[arg-type]
        index = torch.tensor(slots, device=self.device, dtype=torch.int64)
        talker_noise = cp_noise = None
        if any(r.sampling.do_sample or r.sampling.subtalker_do_sample for r in requests):
            noise = self.noise_table[index, torch.tensor(noise_rows, device=self.device)]
            talker_noise, cp_noise = split_step_noise(noise, self.cp_steps, self.cp_vocab)
            if not any(r.sampling.do_sample for r in requests):
                talker_noise = None  # static choice: no sampling work for an all-greedy stage
            if not any(r.sampling.subtalker_do_sample for r in requests):
                cp_noise = None
        rows = self.table.rows(index)
        # Rows in slots 0..B-1 (the usual case: the scheduler keeps slots compact) read the
        # cache through views; otherwise K/V are gathered and scattered by slot index.
        rows.slots = None if slots == list(range(len(slots))) else index
        # Host-side bookkeeping gives the longest attended prefix without a device sync.
        attend_len = max(r.prompt_len + r.frames_emitted for r in requests) + 1
        out = decode_step(self.talker, self.cache, rows, trailing, attend_len, talker_noise, cp_noise)
        scatter_state(self.table, index, rows)
        return out


PADDING_ALLOWANCE = 0.25
"""Padding positions a prefill forward may add, as a fraction of its prompt positions (plus
:data:`PADDING_SLACK`): longer prompts than that go into a forward of their own."""
PADDING_SLACK = 16


def forward_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of prompts of ``lengths`` grouped into prefill forwards: sorted by length
    (longest first), a forward takes the next prompt while its padded size (rows x longest)
    stays within ``(1 + PADDING_ALLOWANCE) x`` its prompt positions ``+ PADDING_SLACK``. Equal
    or near lengths (streamed-text prompts) share one forward; a long prompt does not make many
    short ones pay for its length."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups:
            group = groups[-1]
            longest = lengths[group[0]]
            real = sum(lengths[j] for j in group) + lengths[i]
            if longest * (len(group) + 1) <= (1 + PADDING_ALLOWANCE) * real + PADDING_SLACK:
                group.append(i)
                continue
        groups.append([i])
    return groups
