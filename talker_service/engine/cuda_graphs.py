"""The graph path of the decode step: one static step per batch bucket, all captured at startup.

Running requests sit in slots 0..n-1 (the scheduler keeps them compact), so the step for bucket
``B = bucket_for(n)`` works on *slots 0..B-1 themselves*, with no gather anywhere:

* state: :func:`~.slot_table.leading_rows` views of the slot table, advanced in place by
  :func:`~talker_service.model.step.decode_step` (rows with ``active`` False keep theirs: padding
  rows, which are free slots, and requests waiting for text);
* KV: the cache's slot views, read in place by :class:`~talker_service.model.decode_attention.
  InPlaceAttention` with per-row lengths ``positions + 1`` (no ``B x max_seq_len`` copy; on CUDA
  FlexAttention skips the key blocks past each row's length);
* noise: row ``noise_rows[b]`` of slot b's noise table, picked inside the step;
* static inputs per bucket, written by the host before each replay: ``active`` [B] bool,
  ``trailing`` [B, H], ``noise_rows`` [B] (three small host->device copies);
* outputs: the step's frame codes, next code0 and EOS flags, packed into one [B, G+2] tensor.

Every bucket of ``EngineConfig.graph_buckets`` is captured when the runner is built (before the
talker reports SERVING), largest first, into ONE memory pool (:class:`tts_common.cuda_graphs.
StepCapture`), and the cost is logged and kept in :attr:`GraphStep.report`. The same code runs
without CUDA in ``"emulated"`` mode (eager replay on the same static buffers), which is how CPU CI
exercises bucket choice, bucket switches, padding rows and sampled rows against the eager path.
"""

from __future__ import annotations

import functools
import logging

import torch

from tts_common.cuda_graphs import CapturedStep, CaptureMode, CaptureReport, StepCapture
from tts_common.self_check import check_graph_device

from ..model.decode_attention import InPlaceAttention, InPlaceKernel, default_kernel
from ..model.sampling import split_step_noise
from ..model.step import DecodeState, StepOutput, decode_step
from ..model.talker import KVCache, Talker
from .config import EngineConfig
from .slot_table import leading_rows

logger = logging.getLogger(__name__)


def graph_mode(config: EngineConfig, device: torch.device) -> CaptureMode | None:
    """How the runner steps: real CUDA graphs, their emulation, or None (eager)."""
    if config.emulate_cuda_graphs:
        return "emulated"
    check_graph_device(config.cuda_graphs, device)
    if device.type == "cuda" and config.cuda_graphs != "off":
        return "cuda"
    return None


def attention_kernel(config: EngineConfig, device: torch.device) -> InPlaceKernel:
    """``EngineConfig.in_place_attention`` resolved for ``device``."""
    choice = config.in_place_attention
    if choice == "auto":
        return default_kernel(device)
    if choice not in ("flex", "sdpa"):
        raise ValueError(f"in_place_attention must be auto, flex or sdpa, not {choice!r}")
    return choice  # type: ignore[return-value]


class _Bucket:
    """Static inputs and the step function of one batch bucket."""

    def __init__(
        self,
        talker: Talker,
        cache: KVCache,
        table: DecodeState,
        noise_table: torch.Tensor,
        batch: int,
        kernel: InPlaceKernel,
    ) -> None:
        self.batch = batch
        dev = cache.k.device
        self.active = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.trailing = torch.zeros(batch, talker.cfg.hidden_size, dtype=cache.k.dtype, device=dev)
        self.noise_rows = torch.zeros(batch, dtype=torch.int64, device=dev)
        self._rows = torch.arange(batch, device=dev)
        self._talker, self._cache, self._noise_table = talker, cache, noise_table
        self._state = leading_rows(table, batch)
        self.attention = InPlaceAttention(batch, cache.max_len, dev, kernel)
        """The step's attention (its per-row lengths and mask; read by the self-checks)."""
        cp = talker.cfg.code_predictor
        self._cp_shape = (cp.num_code_groups - 1, cp.vocab_size)

    def run(self, sampling: bool = True) -> torch.Tensor:
        """The captured step: [B, G+2] int64 = frame codes, next code0, EOS flag.
        ``sampling`` False: the all-greedy variant (no noise, no sampling kernels; the codes of
        greedy rows are the same bits either way, see ``choose_tokens``)."""
        talker_noise = cp_noise = None
        if sampling:
            noise = self._noise_table[: self.batch][self._rows, self.noise_rows]  # [B, W]: B rows, no KV
            talker_noise, cp_noise = split_step_noise(noise, *self._cp_shape)
        out = decode_step(
            self._talker,
            self._cache,
            self._state,
            self.trailing,
            self._cache.max_len,
            talker_noise,
            cp_noise,
            active=self.active,
            in_place=self.attention,
        )
        return torch.cat(
            [out.frame_codes, out.next_code0[:, None], out.is_eos[:, None].to(out.frame_codes.dtype)], dim=1
        )


class GraphStep:
    """Every bucket's step, captured at construction; :meth:`step` replays the right one."""

    def __init__(
        self,
        talker: Talker,
        cache: KVCache,
        table: DecodeState,
        noise_table: torch.Tensor,
        config: EngineConfig,
        mode: CaptureMode,
    ) -> None:
        self.config = config
        self.replay = True
        """False: :meth:`step` runs each bucket's step eagerly instead of replaying its graph (on
        CUDA the self-check's reference: same kernels and buffers, no capture)."""
        self.kernel = kernel = attention_kernel(config, cache.k.device)
        self.buckets = {
            b: _Bucket(talker, cache, table, noise_table, b, kernel) for b in config.graph_buckets
        }
        capture = StepCapture(cache.k.device, mode)
        # Largest first: the first capture sizes the shared pool, smaller ones reuse it. Capture
        # runs the step with every row inactive, so no slot's state changes.
        # Each bucket twice: with sampling, and all-greedy (greedy-only batches skip the
        # full-vocabulary sorts of the sampling kernels).
        order = sorted(self.buckets, reverse=True)
        self.captured: dict[str, CapturedStep[torch.Tensor]]
        self.captured, self.report = capture.capture_all(
            [
                (self._name(b, sampling), functools.partial(self.buckets[b].run, sampling))
                for b in order
                for sampling in (True, False)
            ],
            "talker decode step",
        )
        self.report: CaptureReport

    @staticmethod
    def _name(batch: int, sampling: bool = True) -> str:
        return f"talker[B={batch}]" if sampling else f"talker[B={batch},greedy]"

    def step(
        self, slots: list[int], trailing: torch.Tensor, noise_rows: list[int], sampling: bool = True
    ) -> StepOutput:
        """One decode step for the requests in ``slots`` (all < the running count, so inside
        the bucket); outputs in the order of ``slots``. ``sampling`` False: no row samples at any
        stage (the greedy variant replays)."""
        bucket = self.buckets[self.config.bucket_for(max(slots) + 1)]
        device = bucket.active.device
        index = torch.tensor(slots, dtype=torch.int64, device=device)
        bucket.active.zero_()
        bucket.active[index] = True
        bucket.trailing[index] = trailing
        bucket.noise_rows[index] = torch.tensor(noise_rows, dtype=torch.int64, device=device)
        if self.replay:
            out = self.captured[self._name(bucket.batch, sampling)].replay()
        else:  # the same step, run eagerly on the same buffers (the self-check's reference)
            out = bucket.run(sampling)
        packed = out[index]  # a copy: safe past the next replay
        return StepOutput(frame_codes=packed[:, :-2], next_code0=packed[:, -2], is_eos=packed[:, -1].bool())
