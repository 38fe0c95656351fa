"""Per-row logits processing and token choice with tensor parameters (no host syncs off the CPU).

Talker order (HF 4.57.3 as used by the official code, ARCHITECTURE.md §7):
repetition penalty over the row's previously generated code0 ids -> min_new_tokens (EOS = -inf
for the first 2 generated code0) -> suppress [vocab-1024, vocab) except EOS -> [sampling rows:
temperature -> top-k -> top-p] -> greedy argmax or Gumbel-max draw. The code predictor only
uses temperature/top-k/top-p (``subtalker_*``).

Sampling uses the Gumbel-max trick, ``argmax(logits / T + g)`` with ``g = -log(E)``,
``E = -log(U) ~ Exp(1)``, ``U ~ Uniform[0, 1)``: the same distribution as softmax +
multinomial, but the randomness is an *input* tensor. (``E`` from ``uniform_`` and a log, not
``exponential_``: on CPU that draws one value at a time, 6x slower, 6 ms of every 8-row step.)
:class:`RequestNoise` draws it per request from the request's own seeded ``torch.Generator`` so
a request's sampled codes are identical whether it runs alone or batched.

Draw order per request (only the enabled stages draw):
  prefill: one talker draw [talker_vocab] for code0 of frame 0;
  each decode step: the code-predictor draws [G-1, cp_vocab] (codes 1..G-1 of the previous frame,
  in codebook order) and then one talker draw [talker_vocab] for the next code0 (drawn several
  steps at a time, in that order, see :class:`RequestNoise`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from tts_common.synthesis import SamplingParams

NEG_INF = float("-inf")


@dataclass
class SamplingTensors:
    """Batched :class:`~tts_common.synthesis.SamplingParams` (same field names, the seed
    excepted), one entry per row (device tensors, shape [B])."""

    do_sample: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    repetition_penalty: torch.Tensor
    subtalker_do_sample: torch.Tensor
    subtalker_temperature: torch.Tensor
    subtalker_top_k: torch.Tensor
    subtalker_top_p: torch.Tensor

    @classmethod
    def stack(cls, params: Sequence[SamplingParams], device: torch.device | str) -> SamplingTensors:
        """One row per element of ``params``: built on the host as one float64 table (exact for
        these bools, ints below 2**53 and float32 values) and moved with ONE copy, asynchronous
        from pinned memory on CUDA, so an admission adds no host sync per field."""
        names = [f.name for f in fields(cls)]
        table = torch.tensor([[float(getattr(p, n)) for n in names] for p in params], dtype=torch.float64)
        device = torch.device(device)
        if device.type == "cuda":
            table = table.pin_memory().to(device, non_blocking=True)
        else:
            table = table.to(device)
        dtypes = {bool: torch.bool, int: torch.int64, float: torch.float32}
        defaults = SamplingParams()
        return cls(**{n: table[:, i].to(dtypes[type(getattr(defaults, n))]) for i, n in enumerate(names)})

    def rows(self, index: torch.Tensor | slice) -> SamplingTensors:
        """A subset of rows (e.g. dropping finished requests)."""
        return SamplingTensors(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def suppress_mask(vocab: int, eos_id: int, device: torch.device | str) -> torch.Tensor:
    """bool [vocab]: ids [vocab-1024, vocab) except EOS (control/language/speaker ids)."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    mask[max(vocab - 1024, 0) :] = True
    mask[eos_id] = False
    return mask


def apply_talker_penalties(
    logits: torch.Tensor,
    presence: torch.Tensor,
    num_generated: torch.Tensor,
    repetition_penalty: torch.Tensor,
    eos_id: int,
    suppress: torch.Tensor,
    min_new_tokens: int = 2,
) -> torch.Tensor:
    """The three processors greedy decoding also applies (fp32 logits [B, V]).

    presence [B, V] bool: ids generated so far by the row; num_generated [B]: how many code0 the
    row has generated before this one.
    """
    pen = repetition_penalty[:, None].to(logits.dtype)
    penalized = torch.where(logits < 0, logits * pen, logits / pen)
    logits = torch.where(presence, penalized, logits)
    eos_block = (num_generated < min_new_tokens)[:, None] & (
        torch.arange(logits.shape[-1], device=logits.device) == eos_id
    )[None, :]
    logits = logits.masked_fill(eos_block, NEG_INF)
    return logits.masked_fill(suppress[None, :], NEG_INF)


@dataclass(frozen=True)
class TokenChoice:
    """The per-row parameters of a token choice (:func:`choose_tokens`), prepared once for every
    call on the same rows and vocabulary size (the code predictor's 15 choices of a step take one),
    so that each call runs only the ops on its logits. Why: inside a decode step each small op
    costs several times what it costs in a warm loop (the step streams its weights between the
    calls), and the per-row parameters were ~half of a choice's ops. 0.6B dimensions, one row, a
    ~60 ms int8 step on a Zen 4 EPYC: the code predictor's 15 choices took 3.2-3.3 ms, prepared
    each time; prepared once, those and the talker's choice take 1.6-1.9 ms.
    """

    do_sample: torch.Tensor | None
    """[B] bool: rows drawn with their noise (the others greedy); None: every row (then no
    greedy argmax is computed)."""
    temperature: torch.Tensor
    """[B, 1]."""
    kth: torch.Tensor
    """[B, 1] int64: k - 1, the index of the k-th largest score (k = top_k, or the vocabulary
    where top_k is 0)."""
    top_k_max: int | None
    """The batch's largest k (read on the host), or None for static shapes (a full sort)."""
    top_p: torch.Tensor | None
    """[B]; None where no row uses top-p and shapes are not static (the pass is skipped)."""

    @classmethod
    def prepare(
        cls,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        vocab: int,
        do_sample: torch.Tensor | None = None,
        static_shapes: bool | None = None,
    ) -> TokenChoice:
        """Temperature -> top-k (0 = off) -> top-p (1.0 = off) per row over ``vocab`` scores;
        ``do_sample`` [B] bool (None: every row samples).

        ``static_shapes`` (default: on any device but the CPU, and while traced) keeps every shape
        independent of the parameters' values and reads none of them on the host (CUDA graphs, no
        syncs): the k-th largest score from a full sort, and the top-p pass always run. Otherwise
        (CPU) the k-th largest comes from ``topk`` of the batch's largest k and the top-p pass is
        skipped when no row uses it: the same values (``topk`` returns them sorted as the sort
        does, and a skipped pass would drop nothing), at a fraction of the cost (a sampling step of
        the 0.6B code predictor: ~250 vs ~30 us a row, 15 per frame).
        """
        if static_shapes is None:  # traced (torch.compile, graph capture): no host reads either
            static_shapes = top_k.device.type != "cpu" or torch.compiler.is_compiling()
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        uses_top_p = static_shapes or bool((top_p < 1.0).any())
        if do_sample is not None and not static_shapes and bool(do_sample.all()):
            do_sample = None
        return cls(
            do_sample=do_sample,
            temperature=temperature[:, None],
            kth=(k - 1)[:, None],
            top_k_max=None if static_shapes else int(k.max()),
            top_p=top_p if uses_top_p else None,
        )

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] logits -> the scores a sampling row draws from (-inf where dropped)."""
        scores = logits / self.temperature.to(logits.dtype)
        # top-k: keep scores >= the k-th largest (HF keeps ties with the k-th value).
        if self.top_k_max is None:
            desc = torch.sort(scores, dim=-1, descending=True).values
        else:
            desc = torch.topk(scores, self.top_k_max, dim=-1).values
        scores = scores.masked_fill(scores < desc.gather(-1, self.kth), NEG_INF)
        if self.top_p is None:
            return scores
        # top-p: drop the low tail whose cumulative probability is <= 1 - top_p (keep >= 1 token).
        top_p = self.top_p
        asc, asc_idx = torch.sort(scores, dim=-1, descending=False)
        cum = asc.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - top_p)[:, None].to(cum.dtype)
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, asc_idx, drop_sorted)
        drop = drop & (top_p < 1.0)[:, None]
        return scores.masked_fill(drop, NEG_INF)

    def choose(self, logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Greedy argmax for rows with ``do_sample`` False, Gumbel-max draw for the others.

        ``noise`` [B, V] Gumbel noise (ignored on greedy rows); None = greedy for every row (a
        static choice of the caller, e.g. a CUDA graph captured for an all-greedy batch).
        """
        if noise is None:
            return logits.argmax(dim=-1)
        sampled = (self.warp(logits) + noise).argmax(dim=-1)
        if self.do_sample is None:
            return sampled
        return torch.where(self.do_sample, sampled, logits.argmax(dim=-1))


def warp_for_sampling(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    static_shapes: bool | None = None,
) -> torch.Tensor:
    """Temperature -> top-k (0 = off) -> top-p (1.0 = off), per row (:meth:`TokenChoice.warp`;
    ``static_shapes``: :meth:`TokenChoice.prepare`)."""
    vocab = logits.shape[-1]
    return TokenChoice.prepare(temperature, top_k, top_p, vocab, static_shapes=static_shapes).warp(logits)


def choose_tokens(
    logits: torch.Tensor,
    do_sample: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Greedy argmax for rows with ``do_sample`` False, Gumbel-max draw for the others
    (:meth:`TokenChoice.choose`; one call: several on the same rows prepare one
    :class:`TokenChoice`)."""
    if noise is None:
        return logits.argmax(dim=-1)
    return TokenChoice.prepare(temperature, top_k, top_p, logits.shape[-1], do_sample).choose(logits, noise)


def gumbel_from_uniform_(u: torch.Tensor) -> torch.Tensor:
    """``u`` (uniform in [0, 1)) turned in place into Gumbel noise ``-log(E)``, ``E = -log(u)``
    (each clamped to float32's smallest normal first: ``u = 0`` and ``E = 0`` give finite
    values, the far tails, not infinities)."""
    tiny = torch.finfo(torch.float32).tiny
    return u.clamp_min_(tiny).log_().neg_().clamp_min_(tiny).log_().neg_()


class RequestNoise:
    """Per-request Gumbel noise stream (see the module docstring for the draw order).

    Decode-step noise is drawn ``steps_per_draw`` steps at a time (one generator call per stage
    instead of one per step and stage: fewer launches on a GPU) into a chunk ``[K, W]`` the caller
    owns (the runner's per-slot noise table), ``W = cp_steps * cp_vocab + talker_vocab``: row i =
    step i's code-predictor noise then its talker noise. Drawing K steps at once consumes the
    generator in the same order as K single steps, so on CPU the numbers equal the step-by-step
    draws; either way they do not depend on the batch or on the step's code path (eager or graph).
    Columns of a stage that does not sample are left as they are (greedy rows ignore noise).
    """

    def __init__(
        self,
        params: SamplingParams,
        talker_vocab: int,
        cp_vocab: int,
        cp_steps: int,
        device: torch.device | str = "cpu",
        steps_per_draw: int = 8,
    ) -> None:
        self.params = params
        self.talker_vocab, self.cp_vocab, self.cp_steps = talker_vocab, cp_vocab, cp_steps
        self.device = torch.device(device)
        self.steps_per_draw = steps_per_draw
        self._next = steps_per_draw  # row of the chunk the next step uses (K: draw a new chunk)
        self.generator = torch.Generator(device=self.device)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(params.seed))

    @property
    def width(self) -> int:
        """W: noise values of one decode step."""
        return step_noise_width(self.talker_vocab, self.cp_vocab, self.cp_steps)

    @property
    def samples(self) -> bool:
        """Whether any stage samples (otherwise no noise is ever drawn)."""
        return self.params.do_sample or self.params.subtalker_do_sample

    def _gumbel_(self, out: torch.Tensor) -> torch.Tensor:
        """Fill contiguous ``out`` with Gumbel noise (:func:`gumbel_from_uniform_`)."""
        return gumbel_from_uniform_(out.uniform_(generator=self.generator))

    def talker(self) -> torch.Tensor:
        """[talker_vocab] noise for code0 of frame 0 (drawn at prefill; zeros when greedy)."""
        out = torch.zeros(self.talker_vocab, device=self.device)
        return self._gumbel_(out) if self.params.do_sample else out

    def next_step(self, chunk: torch.Tensor) -> int:
        """The row of ``chunk`` [K, W] holding the next decode step's noise; first draws the next
        K steps into it when the previous K are used up."""
        if self._next == self.steps_per_draw:
            self._draw(chunk)
            self._next = 0
        row = self._next
        self._next += 1
        return row

    def _draw(self, chunk: torch.Tensor) -> None:
        cp_width = self.cp_steps * self.cp_vocab
        cp, talker = self.params.subtalker_do_sample, self.params.do_sample
        if cp and talker:
            self._gumbel_(chunk)  # contiguous: both stages in draw order
        elif cp or talker:
            columns = slice(0, cp_width) if cp else slice(cp_width, None)
            width = cp_width if cp else self.talker_vocab
            drawn = torch.empty(self.steps_per_draw, width, device=self.device)
            chunk[:, columns].copy_(self._gumbel_(drawn))


def step_noise_width(talker_vocab: int, cp_vocab: int, cp_steps: int) -> int:
    """W: noise values of one decode step (code predictor then talker)."""
    return cp_steps * cp_vocab + talker_vocab


def split_step_noise(noise: torch.Tensor, cp_steps: int, cp_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W] step noise -> (talker [B, V], code predictor [B, G-1, V_cp])."""
    cp_width = cp_steps * cp_vocab
    return noise[:, cp_width:], noise[:, :cp_width].reshape(-1, cp_steps, cp_vocab)
