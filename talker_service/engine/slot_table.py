"""The slot table: the per-slot decode state that lives between steps.

One :class:`~talker_service.model.step.DecodeState` row per KV slot (position, last code0, past
hidden state, repetition-penalty history, sampling parameters). The eager step gathers the rows of
its requests (``table.rows(index)``), advances them and scatters them back (:func:`scatter_state`);
the graph step advances :func:`leading_rows` (views of slots 0..B-1) in place. Shared by the eager
runner and the graph step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields

import torch

from tts_common.synthesis import SamplingParams

from ..model.sampling import SamplingTensors
from ..model.step import DecodeState
from ..model.talker import Talker


def allocate_table(talker: Talker, num_slots: int, device: torch.device, dtype: torch.dtype) -> DecodeState:
    """A zeroed slot table (every field [num_slots, ...])."""
    params = SamplingTensors.stack([SamplingParams.greedy()] * num_slots, device)
    return DecodeState(
        slots=torch.arange(num_slots, device=device),
        positions=torch.zeros(num_slots, dtype=torch.int64, device=device),
        last_code0=torch.zeros(num_slots, dtype=torch.int64, device=device),
        past_hidden=torch.zeros(num_slots, talker.cfg.hidden_size, dtype=dtype, device=device),
        presence=torch.zeros(num_slots, talker.cfg.vocab_size, dtype=torch.bool, device=device),
        num_generated=torch.zeros(num_slots, dtype=torch.int64, device=device),
        params=params,
    )


def scatter_state(table: DecodeState, index: torch.Tensor, rows: DecodeState) -> None:
    """``table[index] = rows`` for every field (slots excluded: the table's are fixed)."""
    for f in fields(DecodeState):
        if f.name == "slots":
            continue
        if f.name == "params":
            for g in fields(SamplingTensors):
                getattr(table.params, g.name)[index] = getattr(rows.params, g.name)
        else:
            getattr(table, f.name)[index] = getattr(rows, f.name)


def leading_rows(table: DecodeState, batch: int) -> DecodeState:
    """Views of slots 0..batch-1 (``slots`` None: row b is slot b). Updating them in place
    updates the table: the graph step needs no gather or scatter of the state."""
    return dataclasses.replace(table.rows(slice(0, batch)), slots=None)


def move_row(table: DecodeState, src: int, dst: int) -> None:
    """Copy slot ``src``'s row into slot ``dst`` (a request moving slots)."""
    device = table.positions.device
    scatter_state(table, torch.tensor([dst], device=device), table.rows(torch.tensor([src], device=device)))
