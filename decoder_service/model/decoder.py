"""The 12 Hz speech-tokenizer decoder (codec codes -> 24 kHz waveform), ARCHITECTURE.md §9.1.

Plain ``nn.Module``s whose parameter (and buffer) names equal the checkpoint keys under
``decoder.`` in ``speech_tokenizer/model.safetensors``, so the official weights load strictly
(``loading.load_codec_decoder``).

Why streaming needs no look-ahead (§9.1 padding rules): every conv of the decoder has stride 1,
so the official causal padding is ``(k-1)*dilation`` zeros on the left and no right padding (the
"complete the last stride" pad is 0 at stride 1); transposed convs trim only on the right, so output
sample ``t`` depends on inputs ``<= t // stride``; attention sees keys ``j <= i``; the quantizer,
LayerNorm/RMSNorm, linear layers and SnakeBeta act per time step. Hence no output sample is held
back: a chunk of ``n`` frames yields its ``n * samples_per_frame`` samples at once. The per-module
streaming protocol (``step``, batched rows, fixed-shape state) is described in ``primitives``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tts_common.config import CodecDecoderConfig

from .convolutions import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, DecoderBlock, SnakeBeta
from .primitives import State, Stateful
from .quantizer import SplitResidualVectorQuantizer
from .transformer import DecoderTransformer

OFFICIAL_CHUNK_SIZE = 300
OFFICIAL_LEFT_CONTEXT = 25


class CodecDecoder(nn.Module):
    """Qwen3-TTS 12 Hz speech-tokenizer decoder: codes [B, 16, T] -> 24 kHz audio in [-1, 1].

    Whole-utterance: :meth:`decode` (one pass, exact) and :meth:`decode_official_chunked` (the
    official ``chunked_decode``: equal to :meth:`decode` up to 300 frames). Streaming:
    :meth:`init_state` / :meth:`step`, usually through ``streaming.DecoderSession``.

    Built with a checkpoint's weights by ``loading.load_codec_decoder`` (with dev-only random
    weights by ``random_init.init_random_weights``).
    """

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.samples_per_frame = config.samples_per_frame
        self.num_quantizers = config.num_quantizers
        self.cpu_back_group_frames: int | None = 32
        """On CPU, :meth:`step` runs the high-rate conv stack over groups of rows totalling at most
        this many frames (None: all rows at once). Batching buys little there on CPU (its convs
        already have long time axes) while batch-sized activations (hundreds of MB at 1920x)
        thrash caches and the allocator (fresh pages for every large tensor)."""
        self.quantizer = SplitResidualVectorQuantizer(
            config.num_quantizers, config.codebook_dim, config.codebook_size
        )
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, 3)
        self.pre_transformer = DecoderTransformer(config)
        self.upsample = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        CausalConvTranspose1d(config.latent_dim, config.latent_dim, r, r),
                        ConvNeXtBlock(config.latent_dim),
                    ]
                )
                for r in config.upsampling_ratios
            ]
        )
        self.upsample_factor = math.prod(config.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, 7)]
        dim = config.decoder_dim
        for rate in config.upsample_rates:
            layers.append(DecoderBlock(dim, dim // 2, rate))
            dim //= 2
        layers += [SnakeBeta(dim), CausalConv1d(dim, 1, 7)]
        self.decoder = nn.ModuleList(layers)
        for name, module in self.named_modules():
            if isinstance(module, Stateful):
                module.state_key = name

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    # ---------------------------------------------------------------- whole utterance

    def forward(self, codes: Tensor) -> Tensor:
        """The official forward: codes [B, Q, T] (>= 0) -> clamped audio [B, 1, T * samples_per_frame]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(
                f"expected {self.num_quantizers} codebooks, got codes of shape {tuple(codes.shape)}"
            )
        h = self.quantizer.decode(codes)
        h = self.pre_conv(h).transpose(1, 2)
        h = self.pre_transformer(h).transpose(1, 2)
        for convt, convnext in self.upsample:  # type: ignore[misc]
            h = convnext(convt(h))
        for layer in self.decoder:
            h = layer(h)
        return h.clamp(min=-1, max=1)

    def _as_batch(self, codes: Tensor) -> tuple[Tensor, bool]:
        """Accept [B, Q, T] or [T, Q]; padding (-1) becomes 0 as in the official ``decode``."""
        codes = torch.as_tensor(codes, device=self.device).long()
        single = codes.dim() == 2
        if single:
            if codes.shape[1] != self.num_quantizers:
                raise ValueError(f"expected codes [T, {self.num_quantizers}], got {tuple(codes.shape)}")
            codes = codes.t()[None]
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected codes [B, {self.num_quantizers}, T], got {tuple(codes.shape)}")
        return codes.clamp(min=0), single

    @torch.inference_mode()
    def decode(self, codes: Tensor) -> Tensor:
        """Exact whole-utterance decode in one pass.

        codes [B, Q, T] -> float32 [B, T * samples_per_frame]; codes [T, Q] -> [T * samples_per_frame].
        """
        batch, single = self._as_batch(codes)
        wav = self(batch)[:, 0].float()
        return wav[0] if single else wav

    @torch.inference_mode()
    def decode_official_chunked(
        self, codes: Tensor, chunk_size: int = OFFICIAL_CHUNK_SIZE, left_context: int = OFFICIAL_LEFT_CONTEXT
    ) -> Tensor:
        """The official ``chunked_decode``: 300-frame chunks, each after the first decoded with 25
        frames of left context whose audio is dropped. Same shapes as :meth:`decode`."""
        batch, single = self._as_batch(codes)
        total = batch.shape[-1]
        pieces: list[Tensor] = []
        start = 0
        while start < total:
            end = min(start + chunk_size, total)
            context = left_context if start - left_context > 0 else start
            wav = self(batch[..., start - context : end])
            pieces.append(wav[..., context * self.samples_per_frame :])
            start = end
        if not pieces:
            wav = batch.new_zeros((batch.shape[0], 0), dtype=torch.float32)
        else:
            wav = torch.cat(pieces, dim=-1)[:, 0].float()
        return wav[0] if single else wav

    @torch.inference_mode()
    def decode_utterances(
        self, codes: list[Tensor], prefixes: list[Tensor | None] | None = None, official_chunking: bool = True
    ) -> list[Tensor]:
        """Decode a batch of utterances like the official wrapper (float32, 1-D each).

        ``codes[i]`` is [T_i, Q]. With ``prefixes[i]`` (voice-clone ICL reference codes) the item
        decoded is ``prefix ‖ codes`` and the reference part is cut exactly like the official code:
        ``cut = int(ref_len / max(total_len, 1) * wav_len)`` (Python floats; this can keep one
        sample of reference audio for some lengths).
        """
        prefixes = prefixes or [None] * len(codes)
        items = []
        for c, p in zip(codes, prefixes):
            c = torch.as_tensor(c).long()
            items.append(c if p is None else torch.cat([torch.as_tensor(p).long().to(c.device), c], dim=0))
        if not items:
            return []
        longest = max(int(x.shape[0]) for x in items)
        batch = torch.full(
            (len(items), self.num_quantizers, longest), -1, dtype=torch.long, device=self.device
        )
        for i, x in enumerate(items):
            batch[i, :, : x.shape[0]] = x.t().to(self.device)
        wavs = self.decode_official_chunked(batch) if official_chunking else self.decode(batch)
        out: list[Tensor] = []
        for i, (x, p) in enumerate(zip(items, prefixes)):
            wav = wavs[i, : x.shape[0] * self.samples_per_frame]
            if p is not None:
                wav = wav[icl_cut(int(p.shape[0]), int(x.shape[0]), int(wav.shape[0])) :]
            out.append(wav)
        return out

    # ---------------------------------------------------------------- streaming

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        spec: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {}
        for module in self.modules():
            if isinstance(module, Stateful):
                spec.update(module.state_spec())
        return spec

    def init_state(self, batch: int = 1) -> State:
        """Zero streaming state for ``batch`` fresh streams (empty attention slots = position -1)."""
        state: State = {}
        for key, (shape, dtype) in self.state_spec().items():
            if dtype is torch.int64:
                state[key] = torch.full((batch, *shape), -1, dtype=torch.int64, device=self.device)
            else:
                state[key] = torch.zeros((batch, *shape), dtype=self.dtype, device=self.device)
        return state

    def is_back_key(self, key: str) -> bool:
        """Whether a state entry belongs to the conv stack after the upsampler (``decoder.*``)."""
        return key.startswith("decoder.")

    def step_front(
        self, codes: Tensor, positions: Tensor, lengths: Tensor | None, state: State, new_state: State
    ) -> tuple[Tensor, Tensor | None]:
        """Quantizer, pre_conv, pre_transformer and upsampler for one step.

        codes [B, Q, N] (>= 0), positions [B] (frames already consumed per row), lengths [B] valid
        frames per row or None. Returns hidden [B, latent, N * upsample_factor] and its lengths.
        """
        h = self.quantizer.decode(codes)
        h = self.pre_conv.step(h, lengths, state, new_state).transpose(1, 2)
        h = self.pre_transformer.step(h, positions, lengths, state, new_state).transpose(1, 2)
        for convt, convnext in self.upsample:  # type: ignore[misc]
            h = convt.step(h, lengths, state, new_state)
            lengths = None if lengths is None else lengths * convt.stride
            h = convnext.step(h, lengths, state, new_state)
        return h, lengths

    def step_back(self, h: Tensor, lengths: Tensor | None, state: State, new_state: State) -> Tensor:
        """The conv stack (``decoder.*``) for one step: hidden -> clamped audio [B, T_out] (model dtype)."""
        first, *blocks, act, last = self.decoder
        h = first.step(h, lengths, state, new_state)
        for block in blocks:
            h, lengths = block.step(h, lengths, state, new_state)
        h = last.step(h, lengths, state, new_state, act=act)
        return h[:, 0].clamp(min=-1, max=1)

    def step(
        self, codes: Tensor, positions: Tensor, lengths: Tensor | None, state: State
    ) -> tuple[Tensor, State]:
        """Advance a batch of streams: returns float32 audio [B, N * samples_per_frame] and the new
        state. Row b's valid audio is its first ``lengths[b] * samples_per_frame`` samples; its new
        state reflects exactly its first ``lengths[b]`` frames. No host synchronisation, no
        data-dependent shapes (CUDA-graph capturable)."""
        new_state: State = {}
        h, up_lengths = self.step_front(codes.clamp(min=0), positions, lengths, state, new_state)
        rows, frames = codes.shape[0], codes.shape[-1]
        group = rows
        if self.cpu_back_group_frames is not None and h.device.type == "cpu":
            group = max(1, self.cpu_back_group_frames // max(frames, 1))
        if group >= rows:
            wav = self.step_back(h, up_lengths, state, new_state)
            return wav.float(), new_state
        # rows are independent in the conv stack: run it on groups of rows (exact) so that its
        # large high-rate activations stay small (see `cpu_back_group_frames`)
        back_keys = [k for k in state if self.is_back_key(k)]
        pieces: list[Tensor] = []
        parts: dict[str, list[Tensor]] = {k: [] for k in back_keys}
        for r0 in range(0, rows, group):
            rs = slice(r0, r0 + group)
            sub_new: State = {}
            sub_lengths = None if up_lengths is None else up_lengths[rs]
            pieces.append(self.step_back(h[rs], sub_lengths, {k: state[k][rs] for k in back_keys}, sub_new))
            for k in back_keys:
                parts[k].append(sub_new[k])
        new_state.update({k: torch.cat(v) for k, v in parts.items()})
        return torch.cat(pieces).float(), new_state

    def back_receptive_frames(self) -> int:
        """Codec frames of input the conv stack's streaming state can depend on (upper bound).

        Because the stack is feed-forward and causal (finite impulse response), running it from a
        zero state over the last ``back_receptive_frames()`` frames of a prefix yields exactly the
        state that running it over the whole prefix would (used to consume long ICL prefixes
        cheaply: the expensive high-rate stack only runs on the prefix tail).
        """
        span = 0.0  # in codec frames
        rate = float(self.upsample_factor)  # samples per frame at the current layer's input
        first, *blocks, _act, last = self.decoder
        span += first.history / rate
        for block in blocks:
            convt = block.block[1]
            span += (1 + math.ceil(convt.overlap / convt.stride)) / rate
            rate *= convt.stride
            for unit in block.block[2:]:
                span += unit.conv1.history / rate
        span += last.history / rate
        return math.ceil(span) + 1


def icl_cut(ref_frames: int, total_frames: int, wav_samples: int) -> int:
    """Samples of reference audio the official voice-clone code cuts from ``ref ‖ generated``.

    ``int(ref_len / max(total_len, 1) * wav_len)`` in Python floats: usually ``ref_frames *
    samples_per_frame``, but one less for some lengths (then the official output starts with the
    reference audio's last sample).
    """
    return int(ref_frames / max(total_frames, 1) * wav_samples)
