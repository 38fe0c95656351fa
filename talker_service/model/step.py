"""Prefill of prompts into cache slots (several in one forward), and one whole decode step over a
batch of rows.

Frame bookkeeping (ARCHITECTURE.md §5): :func:`prefill` yields code0 of frame 0; each
:func:`decode_step` completes the previous frame (codes 1..G-1 from the code predictor), feeds
the frame's summed embedding (+ the row's trailing text row or tts_pad) to the talker and yields
the next code0. So every decode step emits one complete frame (``StepOutput.frame_codes``); the
row is finished when ``next_code0`` is EOS (that EOS frame is never completed or emitted).

:func:`decode_step` is written for CUDA-graph capture: static shapes for fixed (B, attend_len,
sampling on/off), no ``.item()``, no Python branching on tensor values, state updated in place.
The graph path (:mod:`talker_service.engine.cuda_graphs`) runs it over cache slots 0..B-1 with the
slot table's rows as the state (views, updated in place), in-place attention, and an ``active``
mask for the rows that take no step (padding rows, requests waiting for text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from .decode_attention import InPlaceAttention
from .layers import AttentionSpec
from .sampling import SamplingTensors, TokenChoice, apply_talker_penalties, choose_tokens
from .talker import KVCache, Talker


@dataclass
class DecodeState:
    """Per-row decode state, [B, ...] tensors on the model's device, updated in place.

    * ``slots``: cache slot of each row (see :class:`~talker_service.model.layers.AttentionSpec`;
      None = row b uses slot b).
    * ``positions`` [B]: cache position the next talker input is written at (prompt length P
      at the first decode step, then +1 per step).
    * ``last_code0`` [B]: code0 of the frame the next step completes.
    * ``past_hidden`` [B, H]: talker final-norm hidden state of the last position.
    * ``presence`` [B, vocab] bool: code0 ids generated so far (repetition penalty).
    * ``num_generated`` [B]: number of code0 generated so far (min_new_tokens).
    * ``params``: per-row sampling parameters.
    """

    slots: torch.Tensor | None
    positions: torch.Tensor
    last_code0: torch.Tensor
    past_hidden: torch.Tensor
    presence: torch.Tensor
    num_generated: torch.Tensor
    params: SamplingTensors

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    @classmethod
    def cat(cls, states: list[DecodeState]) -> DecodeState:
        """Concatenate single/multi-row states (slots must all be tensors)."""
        out: dict[str, object] = {}
        for f in fields(cls):
            vals = [getattr(s, f.name) for s in states]
            if f.name == "params":
                out[f.name] = SamplingTensors(
                    **{g.name: torch.cat([getattr(v, g.name) for v in vals]) for g in fields(SamplingTensors)}
                )
            elif f.name == "slots":
                if any(v is None for v in vals):
                    raise ValueError("DecodeState.cat needs explicit slot tensors")
                out[f.name] = torch.cat(vals)  # type: ignore[arg-type]
            else:
                out[f.name] = torch.cat(vals)
        return cls(**out)  # type: ignore[arg-type]

    def rows(self, index: torch.Tensor | slice) -> DecodeState:
        """Subset of rows: copies for an index tensor (e.g. to drop finished requests), views for
        a slice."""
        return DecodeState(
            slots=None if self.slots is None else self.slots[index],
            positions=self.positions[index],
            last_code0=self.last_code0[index],
            past_hidden=self.past_hidden[index],
            presence=self.presence[index],
            num_generated=self.num_generated[index],
            params=self.params.rows(index),
        )


@dataclass
class StepOutput:
    """Result of one decode step for every row."""

    frame_codes: torch.Tensor
    """[B, G] int64: the completed frame (code0 = the previous ``last_code0``)."""
    next_code0: torch.Tensor
    """[B] int64: code0 of the next frame (EOS = the row is done after this frame)."""
    is_eos: torch.Tensor
    """[B] bool: ``next_code0 == codec_eos``."""


def choose_code0(
    talker: Talker,
    logits: torch.Tensor,
    presence: torch.Tensor,
    num_generated: torch.Tensor,
    params: SamplingTensors,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Talker processors (§7) + greedy/Gumbel choice: logits [B, V] fp32 -> code0 [B]."""
    processed = apply_talker_penalties(
        logits,
        presence,
        num_generated,
        params.repetition_penalty,
        talker.cfg.codec_eos_token_id,
        talker.suppress_mask(logits.device),
    )
    return choose_tokens(processed, params.do_sample, params.temperature, params.top_k, params.top_p, noise)


class PromptAttention:
    """Causal attention of several prompts prefilled in one forward, each row over exactly its
    own prompt (the ``in_place`` hook of :class:`~talker_service.model.layers.AttentionSpec`).

    The rows are padded to the longest prompt, but each row (or run of rows of equal length)
    attends with SDPA's causal mode over its own ``length`` keys: the call that prompt makes when
    prefilled alone. A longer window with the padding masked sums in another order (last-bit
    differences on CPU's flash kernel), so a prompt's K/V and hidden states would depend on the
    others in its forward.
    """

    def __init__(self, lengths: Sequence[int]) -> None:
        self.lengths = list(lengths)
        """Prompt positions of each row (host ints: no device sync)."""

    def attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, enable_gqa: bool
    ) -> torch.Tensor:
        """q [B, heads, S, hd]; keys/values [B, kv_heads, >= S, hd] -> [B, heads, S, hd] (zeros
        at padding positions)."""
        if all(n == q.shape[2] for n in self.lengths):  # no padding (one prompt, equal lengths)
            return F.scaled_dot_product_attention(
                q, keys, values, is_causal=True, scale=scale, enable_gqa=enable_gqa
            )
        out = q.new_zeros(q.shape)
        start = 0
        while start < len(self.lengths):
            n = self.lengths[start]
            end = start + 1
            while end < len(self.lengths) and self.lengths[end] == n:
                end += 1
            out[start:end, :, :n] = F.scaled_dot_product_attention(
                q[start:end, :, :n],
                keys[start:end, :, :n],
                values[start:end, :, :n],
                is_causal=True,
                scale=scale,
                enable_gqa=enable_gqa,
            )
            start = end
        return out


def _host_ints(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 [len(values)] on ``device`` with one copy, asynchronous from pinned memory on CUDA
    (a plain host-to-device copy waits for the queued GPU work: a host sync)."""
    table = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)


@torch.inference_mode()
def prefill_prompts(
    talker: Talker,
    cache: KVCache,
    slots: Sequence[int],
    prompts: Sequence[torch.Tensor],
    params: SamplingTensors,
    noise: torch.Tensor | None = None,
) -> DecodeState:
    """Run several prompts [P_i, H] in one forward, prompt i into cache slot ``slots[i]``, and
    pick code0 of frame 0 of each.

    The prompts are padded to the longest along the sequence (positions 0..P_i-1 of each row;
    padding K/V lands past the prompt in its slot, where nothing reads it before the first
    decode step overwrites it), and attend causally each over its own length
    (:class:`PromptAttention`). Every other operation is row-wise (the CPU linear kernels are
    row-invariant: tts_common.kernels), so on CPU a prompt's outputs are bit-identical whatever
    prompts share its forward.
    ``params``: one row per prompt; ``noise`` [N, V] Gumbel noise (sampling rows) or None.
    Returns the N-row decode state (slots = ``slots``, positions = the prompt lengths).
    """
    lengths = [p.shape[0] for p in prompts]
    if len(set(slots)) != len(slots):
        raise ValueError(f"prompts prefilled together need distinct slots, got {list(slots)}")
    if max(lengths) > cache.max_len:
        raise ValueError(f"prompt of {max(lengths)} positions exceeds the cache length {cache.max_len}")
    device = prompts[0].device
    n, longest = len(prompts), max(lengths)
    x = torch.nn.utils.rnn.pad_sequence(list(prompts), batch_first=True)  # zeros after each prompt
    slot_index, length_index = _host_ints([*slots, *lengths], device).split(n)
    spec = AttentionSpec(
        positions=torch.arange(longest, device=device)[None, :].expand(n, longest),
        slots=slot_index,
        attend_len=longest,
        mask=None,
        is_causal=False,
        in_place=PromptAttention(lengths),  # type: ignore[arg-type]  # same attend() contract
    )
    hidden = talker.model.run_layers(x, cache.k, cache.v, spec)
    cache.lengths[slot_index] = length_index
    past_hidden = hidden[torch.arange(n, device=device), length_index - 1]
    logits = talker.logits(past_hidden)
    presence = torch.zeros(n, talker.cfg.vocab_size, dtype=torch.bool, device=device)
    num_generated = torch.zeros(n, dtype=torch.int64, device=device)
    code0 = choose_code0(talker, logits, presence, num_generated, params, noise)
    presence.scatter_(1, code0[:, None], True)
    return DecodeState(
        slots=slot_index,
        positions=length_index,
        last_code0=code0,
        past_hidden=past_hidden,
        presence=presence,
        num_generated=num_generated + 1,
        params=params,
    )


def prefill(
    talker: Talker,
    cache: KVCache,
    slot: int,
    prefill_embeds: torch.Tensor,
    params: SamplingTensors,
    noise: torch.Tensor | None = None,
) -> DecodeState:
    """Run one request's prompt [P, H] into cache ``slot`` and pick code0 of frame 0
    (:func:`prefill_prompts` of one prompt).

    ``params``: one-row sampling tensors; ``noise`` [V] Gumbel noise (sampling) or None.
    Returns the one-row decode state (slots = [slot], positions = [P]).
    """
    return prefill_prompts(
        talker, cache, [slot], [prefill_embeds], params, None if noise is None else noise[None]
    )


def predict_residual_codes(
    talker: Talker,
    past_hidden: torch.Tensor,
    code0: torch.Tensor,
    params: SamplingTensors,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Codes 1..G-1 of a frame with the code predictor (§6): [B, H], [B] -> [B, G-1].

    A fresh static cache per call: prefill of ``[past_hidden, C(code0)]`` at positions 0, 1,
    then G-2 single steps; each step attends to exactly the written prefix (no mask).
    ``noise`` [B, G-1, cp_vocab] or None (all greedy).
    """
    cp = talker.code_predictor
    b = past_hidden.shape[0]
    groups = cp.num_groups
    device = past_hidden.device
    k_cache, v_cache = cp.new_cache(b, device, past_hidden.dtype)
    sp = params

    x = torch.stack([past_hidden, talker.codec_embed(code0)], dim=1)
    x = cp.small_to_mtp_projection(x)
    spec = AttentionSpec(
        positions=torch.arange(2, device=device)[None, :].expand(b, 2),
        slots=None,
        attend_len=2,
        mask=None,
        is_causal=True,
        prefix_only=True,  # positions 0, 1 of each row's own slot, causal
    )
    h = cp.model.run_layers(x, k_cache, v_cache, spec)
    # One preparation for the G-1 choices (same rows, same vocabulary): fewer ops per choice.
    choice = None
    if noise is not None:
        choice = TokenChoice.prepare(
            sp.subtalker_temperature,
            sp.subtalker_top_k,
            sp.subtalker_top_p,
            cp.cfg.vocab_size,
            sp.subtalker_do_sample,
        )
    codes: list[torch.Tensor] = []
    for step in range(groups - 1):
        if step > 0:
            x = cp.small_to_mtp_projection(cp.model.codec_embedding[step - 1](codes[-1])[:, None])
            spec = AttentionSpec(
                positions=torch.full((b, 1), step + 1, dtype=torch.int64, device=device),
                slots=None,
                attend_len=step + 2,
                mask=None,
                is_causal=False,
                prefix_only=True,  # keys [0, step + 1]: the written prefix
            )
            h = cp.model.run_layers(x, k_cache, v_cache, spec)
        logits = cp.lm_head[step](h[:, -1]).to(torch.float32)
        if choice is None or noise is None:  # all greedy: a static choice of the caller
            codes.append(logits.argmax(dim=-1))
        else:
            codes.append(choice.choose(logits, noise[:, step]))
    return torch.stack(codes, dim=1)


def decode_step(
    talker: Talker,
    cache: KVCache,
    state: DecodeState,
    trailing_rows: torch.Tensor,
    attend_len: int,
    talker_noise: torch.Tensor | None = None,
    cp_noise: torch.Tensor | None = None,
    *,
    active: torch.Tensor | None = None,
    in_place: InPlaceAttention | None = None,
) -> StepOutput:
    """One whole decode step for every row of ``state`` (updated in place).

    trailing_rows [B, H]: the row's next trailing text embedding, or tts_pad once exhausted.
    attend_len (static int): > every row's ``positions`` (use a bucket for CUDA graphs; the
    exact ``max(positions)+1`` reproduces the reference bit for bit at batch 1).
    talker_noise [B, V] / cp_noise [B, G-1, cp_vocab]: Gumbel noise (ignored on greedy rows), or
    None when no row samples at that stage (a static choice).
    active [B] bool or None (all): rows whose state advances. An inactive row still computes (and
    writes K/V at its current position, which its next real step overwrites) but its state is
    left as it was and its outputs are meaningless.
    in_place: read the cache in place with per-row lengths (rows = slots 0..B-1, ``attend_len`` =
    the slot length; see :meth:`Talker.forward`).
    """
    with torch.inference_mode():
        residual = predict_residual_codes(talker, state.past_hidden, state.last_code0, state.params, cp_noise)
        frame = torch.cat([state.last_code0[:, None], residual], dim=1)
        x = talker.frame_embed(frame) + trailing_rows
        hidden = talker(
            x[:, None], state.positions[:, None], cache, state.slots, attend_len, in_place=in_place
        )
        past_hidden = hidden[:, -1]
        logits = talker.logits(past_hidden)
        code0 = choose_code0(talker, logits, state.presence, state.num_generated, state.params, talker_noise)
        if active is None:
            state.presence.scatter_(1, code0[:, None], True)
            state.num_generated.add_(1)
            state.positions.add_(1)
            state.last_code0.copy_(code0)
            state.past_hidden.copy_(past_hidden)
        else:
            state.presence.scatter_(
                1, code0[:, None], active[:, None] | state.presence.gather(1, code0[:, None])
            )
            state.num_generated.add_(active)
            state.positions.add_(active)
            state.last_code0.copy_(torch.where(active, code0, state.last_code0))
            state.past_hidden.copy_(torch.where(active[:, None], past_hidden, state.past_hidden))
        return StepOutput(frame_codes=frame, next_code0=code0, is_eos=code0 == talker.cfg.codec_eos_token_id)
