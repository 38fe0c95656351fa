"""Offline generation: prompts -> codec codes, batched with the static-cache step function.

``max_new_tokens = M`` gives at most M-1 frames (ARCHITECTURE.md §5); the EOS frame is excluded.
The per-step host work (EOS checks, trailing-row selection, noise) lives here, outside
:func:`~talker_service.model.step.decode_step`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .loader import TalkerModel
from .prompt import SynthesisRequest, TalkerPrompt
from .sampling import RequestNoise, SamplingParams, SamplingTensors, step_noise
from .step import DecodeState, decode_step, prefill


@dataclass
class FrameEvent:
    """One streamed result: ``codes`` [G] int64 of frame ``frame`` of request ``request``, or
    (``codes is None``) the end of that request (EOS or budget), ``stopped_by_eos`` telling which."""

    request: int
    frame: int
    codes: torch.Tensor | None
    stopped_by_eos: bool = False


def _as_prompts(
    model: TalkerModel, requests: Sequence[SynthesisRequest | TalkerPrompt]
) -> list[TalkerPrompt]:
    return [r if isinstance(r, TalkerPrompt) else model.build_prompt(r) for r in requests]


def iter_frames(
    model: TalkerModel,
    requests: Sequence[SynthesisRequest | TalkerPrompt],
    max_new_tokens: int,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> Iterator[FrameEvent]:
    """Generate a batch, yielding each frame as soon as its 16 codes are complete.

    ``params``: one for all, one per request, or None (= the checkpoint's generation defaults).
    Each request ends with a ``FrameEvent(codes=None)``.
    """
    prompts = _as_prompts(model, requests)
    n = len(prompts)
    if n == 0:
        return
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if params is None:
        params = SamplingParams.from_defaults(model.config.generation)
    plist = [params] * n if isinstance(params, SamplingParams) else list(params)
    if len(plist) != n:
        raise ValueError(f"{len(plist)} sampling params for {n} requests")

    talker, device = model.talker, model.device
    tcfg = model.config.model.talker
    cp_steps = tcfg.code_predictor.num_code_groups - 1
    noises = [
        RequestNoise(p, tcfg.vocab_size, tcfg.code_predictor.vocab_size, cp_steps, device) for p in plist
    ]
    prefill_lens = [p.prefill_len for p in prompts]
    cache = model.allocate_cache(n, max(prefill_lens) + max_new_tokens)

    states = []
    for i, (prompt, p) in enumerate(zip(prompts, plist)):
        noise = noises[i].talker() if p.do_sample else None
        states.append(prefill(talker, cache, i, prompt.prefill, SamplingTensors.stack([p], device), noise))
    state = DecodeState.cat(states)
    first = state.last_code0.tolist()

    active = [i for i in range(n) if first[i] != tcfg.codec_eos_token_id]
    for i in range(n):
        if i not in active:
            yield FrameEvent(i, 0, None, stopped_by_eos=True)
    if len(active) != n:
        state = state.rows(torch.tensor(active, device=device))

    for step in range(max_new_tokens - 1):
        if not active:
            break
        trailing = torch.stack([prompts[i].trailing_row(step) for i in active])
        talker_noise, cp_noise = step_noise([noises[i] for i in active])
        attend_len = max(prefill_lens[i] for i in active) + step + 1
        out = decode_step(talker, cache, state, trailing, attend_len, talker_noise, cp_noise)
        frames = out.frame_codes.cpu()
        eos = out.is_eos.tolist()
        for row, i in enumerate(active):
            yield FrameEvent(i, step, frames[row])
        last = step == max_new_tokens - 2
        keep = []
        for row, i in enumerate(active):
            if eos[row] or last:
                yield FrameEvent(i, step + 1, None, stopped_by_eos=bool(eos[row]))
            else:
                keep.append(row)
        if len(keep) != len(active):
            active = [active[r] for r in keep]
            if active:
                state = state.rows(torch.tensor(keep, device=device))
    if max_new_tokens == 1:
        for i in active:
            yield FrameEvent(i, 0, None)


def generate(
    model: TalkerModel,
    requests: Sequence[SynthesisRequest | TalkerPrompt],
    max_new_tokens: int,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[torch.Tensor]:
    """Codes [frames, G] int64 (CPU) per request, EOS frame excluded, at most M-1 frames."""
    groups = model.config.model.talker.code_predictor.num_code_groups
    frames: list[list[torch.Tensor]] = [[] for _ in requests]
    for ev in iter_frames(model, requests, max_new_tokens, params):
        if ev.codes is not None:
            frames[ev.request].append(ev.codes)
    return [
        torch.stack(f).to(torch.int64) if f else torch.zeros(0, groups, dtype=torch.int64) for f in frames
    ]
