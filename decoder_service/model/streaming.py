"""Seamless streaming decode: per-utterance sessions, batched advance, chunk schedule.

A :class:`DecoderSession` holds the exact state the causal decoder needs between chunks
(``CodecDecoder.state_spec``): per pre-transformer layer the last ``sliding_window`` (72) rotated
keys/values and their absolute positions; the last ``(k-1)*dilation`` inputs of every causal conv
(pre_conv, ConvNeXt depthwise convs, decoder convs including the dilated residual-unit convs); the
pending overlap of every causal transposed conv. Every op is causal (ARCHITECTURE.md §9.1: stride-1
convs pad on the left only, transposed convs trim on the right only, attention sees keys
``i-72 < j <= i``), so no look-ahead is needed and **no output sample is held back**: feeding a
chunk of ``n`` frames returns exactly ``n * 1920`` samples, equal (up to float rounding) to the
corresponding samples of the whole-utterance decode ``CodecDecoder.decode`` of all frames fed so
far, whatever the chunking.

Note: for more than 300 frames the official ``chunked_decode`` is *not* the exact decode (each
300-frame chunk restarts with only 25 frames of context); streaming reproduces the exact decode.

:func:`advance_sessions` advances many sessions with one forward (rows right-padded to the longest
chunk; each row's state is re-extracted at its own valid length), :class:`SessionBatcher` does the
same with static-shape buckets (and optional CUDA graphs on cuda), :class:`ChunkSchedule` gives
growing chunk sizes for low first-chunk latency.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from tts_common.chunking import CHUNK_GROWTH, DEFAULT_FIRST_CHUNK_FRAMES, DEFAULT_MAX_CHUNK_FRAMES

from .decoder import OFFICIAL_CHUNK_SIZE, CodecDecoder
from .primitives import State

if TYPE_CHECKING:
    from .cuda_graphs import CudaGraphSteps

CodesLike = Tensor | np.ndarray | Sequence[Sequence[int]]


# --------------------------------------------------------------------------------------------
# chunk schedule


@dataclass(frozen=True)
class ChunkSchedule:
    """Chunk sizes (frames) for streaming: ``first``, then x``growth`` each chunk, capped at ``max``.

    ``ChunkSchedule(first=2, growth=2.0, max=25)`` yields 2, 4, 8, 16, 25, 25, ... A small first
    chunk gives low first-audio latency; larger later chunks amortise per-forward overhead.
    """

    first: int = DEFAULT_FIRST_CHUNK_FRAMES
    growth: float = CHUNK_GROWTH
    max: int = DEFAULT_MAX_CHUNK_FRAMES

    def __post_init__(self) -> None:
        if self.first < 1 or self.max < self.first:
            raise ValueError(f"need 1 <= first <= max, got first={self.first} max={self.max}")
        if self.growth < 1.0:
            raise ValueError(f"growth must be >= 1, got {self.growth}")

    def sizes(self) -> Iterator[int]:
        """The infinite sequence of chunk sizes."""
        size = float(self.first)
        while True:
            yield min(self.max, math.ceil(size - 1e-9))
            size = min(size * self.growth, float(self.max))

    def size(self, index: int) -> int:
        """Size of chunk ``index`` (0-based)."""
        for i, s in enumerate(self.sizes()):
            if i == index or s == self.max:
                return s
        raise AssertionError("unreachable")

    def split(self, total: int) -> list[int]:
        """Chunk sizes covering ``total`` frames (the last one may be shorter)."""
        out: list[int] = []
        left = total
        for s in self.sizes():
            if left <= 0:
                break
            out.append(min(s, left))
            left -= out[-1]
        return out


# --------------------------------------------------------------------------------------------
# sessions


def _as_frames(decoder: CodecDecoder, codes: CodesLike) -> Tensor:
    """Validate codes [n, Q] (host side, before any device transfer) -> int64 tensor on the device."""
    t = torch.as_tensor(np.asarray(codes) if not isinstance(codes, Tensor) else codes).long()
    if t.dim() != 2 or t.shape[1] != decoder.num_quantizers:
        raise ValueError(f"expected codes [frames, {decoder.num_quantizers}], got {tuple(t.shape)}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= decoder.config.codebook_size):
        raise ValueError(f"codes must be in [0, {decoder.config.codebook_size})")
    return t.to(decoder.device)


class DecoderSession:
    """Streaming decode state of one utterance.

    ``prefix_codes`` ([P, Q], e.g. voice-clone ICL reference codes) are decoded as left context
    and their audio is not returned: the first sample :meth:`feed` returns is the first sample of
    the first generated frame in the decode of ``prefix ‖ generated``.

    Voice clone: the official non-streaming code decodes ``ref ‖ generated`` and cuts
    ``decoder.icl_cut(...)`` samples, which for some length pairs (~4%) is one sample less
    than ``P * samples_per_frame`` (its output then starts with the last reference sample). A
    session always returns exactly the generated frames' samples, ``n * samples_per_frame`` per
    chunk (what the internal Decoder API specifies).

    With ``fast_prefix`` the expensive high-rate conv stack only runs over the last
    ``decoder.back_receptive_frames()`` prefix frames (it is a causal FIR network, so its state
    after the prefix is the same); the transformer and upsampler run over the whole prefix.
    """

    def __init__(
        self, decoder: CodecDecoder, prefix_codes: CodesLike | None = None, *, fast_prefix: bool = True
    ) -> None:
        self.decoder = decoder
        self.state: State = decoder.init_state(1)
        self.position = 0
        """Frames consumed so far, prefix included (the absolute position of the next frame)."""
        self.prefix_frames = 0
        self.frames = 0
        """Generated (non-prefix) frames fed so far."""
        if prefix_codes is not None:
            self._consume_prefix(_as_frames(decoder, prefix_codes), fast_prefix)

    def feed(self, codes: CodesLike) -> Tensor:
        """Decode the next ``n`` frames ([n, Q]) -> float32 audio [n * samples_per_frame] on the device."""
        return advance_sessions([self], [codes])[0]

    @torch.inference_mode()
    def _consume_prefix(self, prefix: Tensor, fast: bool) -> None:
        dec = self.decoder
        total = int(prefix.shape[0])
        warm = dec.back_receptive_frames()
        if not fast or total <= warm:
            for start in range(0, total, OFFICIAL_CHUNK_SIZE):
                _step_rows(dec, [self], [prefix[start : start + OFFICIAL_CHUNK_SIZE]])
        else:
            tail_start = total - warm
            tails: list[Tensor] = []
            for start in range(0, total, OFFICIAL_CHUNK_SIZE):
                chunk = prefix[start : start + OFFICIAL_CHUNK_SIZE]
                new: State = {}
                pos = torch.tensor([self.position], device=dec.device)
                h, _ = dec.step_front(chunk.t()[None], pos, None, self.state, new)
                self.state.update(new)
                self.position += int(chunk.shape[0])
                keep_from = max(0, tail_start - start) * dec.upsample_factor
                if keep_from < h.shape[-1]:
                    tails.append(h[..., keep_from:])
            # the back state is still the zero state: run the conv stack over the tail only
            new = {}
            dec.step_back(torch.cat(tails, dim=-1), None, self.state, new)
            self.state.update(new)
            self.position = total
        self.prefix_frames = total
        self.frames = 0


# --------------------------------------------------------------------------------------------
# batched advance


def _stack_states(decoder: CodecDecoder, sessions: Sequence[DecoderSession], pad_rows: int) -> State:
    states = [s.state for s in sessions]
    if pad_rows:
        states.append(decoder.init_state(pad_rows))
    if len(states) == 1:
        return dict(states[0])
    return {k: torch.cat([st[k] for st in states], dim=0) for k in states[0]}


@torch.inference_mode()
def _step_rows(
    decoder: CodecDecoder,
    sessions: Sequence[DecoderSession],
    chunks: Sequence[Tensor],
    batch_to: int | None = None,
    frames_to: int | None = None,
    graphs: CudaGraphSteps | None = None,
) -> list[Tensor]:
    """One batched forward over validated chunks ([n_i, Q] on the device); updates the sessions."""
    lens = [int(c.shape[0]) for c in chunks]
    n = max(lens) if frames_to is None else frames_to
    rows = len(sessions) if batch_to is None else batch_to
    spf = decoder.samples_per_frame
    if n == 0:
        return [torch.zeros(0, device=decoder.device) for _ in sessions]
    codes = torch.zeros((rows, decoder.num_quantizers, n), dtype=torch.long, device=decoder.device)
    for i, c in enumerate(chunks):
        codes[i, :, : lens[i]] = c.t()
    positions = torch.tensor(
        [s.position for s in sessions] + [0] * (rows - len(sessions)), device=decoder.device
    )
    uniform = batch_to is None and frames_to is None and all(x == n for x in lens)
    # lengths=None selects the cheaper slicing path when every row is full
    lengths = None if uniform else torch.tensor(lens + [0] * (rows - len(sessions)), device=decoder.device)
    state = _stack_states(decoder, sessions, rows - len(sessions))
    if graphs is not None:
        assert lengths is not None
        wav, new_state = graphs.step(codes, positions, lengths, state)
    else:
        wav, new_state = decoder.step(codes, positions, lengths, state)
    out: list[Tensor] = []
    for i, s in enumerate(sessions):
        s.state = {k: v[i : i + 1] for k, v in new_state.items()}
        s.position += lens[i]
        s.frames += lens[i]
        out.append(wav[i, : lens[i] * spf])
    return out


def advance_sessions(sessions: Sequence[DecoderSession], chunks: Sequence[CodesLike]) -> list[Tensor]:
    """Advance many sessions (same decoder, any positions) by one chunk each with one forward.

    ``chunks[i]`` is [n_i, Q] (n_i may differ, and be 0). Rows are right-padded to the longest
    chunk; each session's new state is taken at its own valid length, so the result equals
    advancing each session alone. Returns float32 audio [n_i * samples_per_frame] per session.
    Eager, no bucketing (see :class:`SessionBatcher` for static shapes / CUDA graphs).
    """
    if len(sessions) != len(chunks):
        raise ValueError("one chunk per session")
    if not sessions:
        return []
    decoder = sessions[0].decoder
    if any(s.decoder is not decoder for s in sessions):
        raise ValueError("all sessions must share one decoder")
    if len({id(s) for s in sessions}) != len(sessions):
        raise ValueError("a session may appear only once per step")
    return _step_rows(decoder, sessions, [_as_frames(decoder, c) for c in chunks])


def _bucket(value: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


class SessionBatcher:
    """Batched advance with static shapes: (batch, frames) padded up to bucket sizes.

    Static shapes let a CUDA caching allocator / CUDA graphs reuse work across steps. Batches
    larger than the largest batch bucket are split into groups; chunks longer than the largest
    frame bucket are decoded in several steps (exact: streaming is chunking-invariant).
    ``pad_to_buckets`` (default: only on cuda — on CPU padded rows/frames are pure extra work)
    pads every step to its bucket. ``use_cuda_graphs`` (cuda only; default: on when the decoder is
    on cuda) replays one graph per (batch, frames) bucket, all captured here, at construction
    (``cuda_graphs.CudaGraphSteps``: one memory pool, largest first). ``emulate_cuda_graphs`` runs
    that same graph path on any device with eager replays (CPU tests of the bookkeeping); otherwise
    CPU steps run eagerly. ``graph_memory`` (bytes; None = no bound) bounds what the graphs hold:
    the batch sizes that do not fit are dropped from ``batch_buckets`` (larger groups split).
    """

    def __init__(
        self,
        decoder: CodecDecoder,
        batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32),
        frame_buckets: Sequence[int] = (1, 2, 4, 8, 16, 25, 32),
        use_cuda_graphs: bool | None = None,
        pad_to_buckets: bool | None = None,
        emulate_cuda_graphs: bool = False,
        graph_memory: int | None = None,
    ) -> None:
        self.decoder = decoder
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.frame_buckets = tuple(sorted(frame_buckets))
        on_cuda = decoder.device.type == "cuda"
        if use_cuda_graphs is None:
            use_cuda_graphs = on_cuda
        if use_cuda_graphs and not on_cuda:
            raise ValueError("CUDA graphs need a decoder on a cuda device")
        graphs = use_cuda_graphs or emulate_cuda_graphs
        self.pad_to_buckets = (on_cuda or graphs) if pad_to_buckets is None else pad_to_buckets
        if graphs and not self.pad_to_buckets:
            raise ValueError("CUDA graphs need static shapes (pad_to_buckets)")
        self.graphs: CudaGraphSteps | None = None
        if graphs:
            from .cuda_graphs import CudaGraphSteps

            mode = "emulated" if emulate_cuda_graphs else "cuda"
            self.graphs = CudaGraphSteps(
                decoder, self.batch_buckets, self.frame_buckets, mode, memory_bound=graph_memory
            )
            if not self.graphs.batch_buckets:  # nothing fits the bound: eager (logged there)
                self.graphs = None
            else:  # larger groups run as several captured steps
                self.batch_buckets = self.graphs.batch_buckets

    def advance(self, sessions: Sequence[DecoderSession], chunks: Sequence[CodesLike]) -> list[Tensor]:
        """Same contract as :func:`advance_sessions`."""
        if len(sessions) != len(chunks):
            raise ValueError("one chunk per session")
        dec = self.decoder
        if any(s.decoder is not dec for s in sessions):
            raise ValueError("all sessions must use this batcher's decoder")
        if len({id(s) for s in sessions}) != len(sessions):
            raise ValueError("a session may appear only once per step")
        frames = [_as_frames(dec, c) for c in chunks]
        pieces: list[list[Tensor]] = [[] for _ in sessions]
        max_b, max_n = self.batch_buckets[-1], self.frame_buckets[-1]
        for g0 in range(0, len(sessions), max_b):
            group = list(range(g0, min(g0 + max_b, len(sessions))))
            offset = 0
            while True:
                sub = [frames[i][offset : offset + max_n] for i in group]
                longest = max(int(c.shape[0]) for c in sub)
                if longest == 0:
                    break
                if self.pad_to_buckets:
                    outs = _step_rows(
                        dec,
                        [sessions[i] for i in group],
                        sub,
                        batch_to=_bucket(len(group), self.batch_buckets),
                        frames_to=_bucket(longest, self.frame_buckets),
                        graphs=self.graphs,
                    )
                else:
                    outs = _step_rows(dec, [sessions[i] for i in group], sub)
                for i, o in zip(group, outs):
                    pieces[i].append(o)
                offset += max_n
        return [
            torch.cat(p) if len(p) > 1 else (p[0] if p else torch.zeros(0, device=dec.device)) for p in pieces
        ]
