"""The talker LM (ARCHITECTURE.md §5) and its explicit, preallocated KV cache.

Parameter names equal the checkpoint keys under ``talker.`` so
``tts_common.weights.load_module_weights(talker, path, "talker.")`` loads strictly.

Cache layout (:class:`KVCache`): ``k``/``v`` of shape [num_layers, num_slots, kv_heads, max_len,
head_dim]. A request owns one slot for its lifetime; its token at position p (0 = first prompt
token, no left padding) lives at ``[:, slot, :, p]``. Attention reads ``[0, attend_len)`` of the
slot and masks keys after the query's own position, so stale entries of an earlier request in
the same slot are never visible and rows of different lengths batch freely.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tts_common.config import TalkerConfig
from tts_common.memory import lazy_zeros

from .code_predictor import CodePredictor
from .decode_attention import InPlaceAttention
from .layers import AttentionSpec, DecoderStack
from .sampling import suppress_mask


@dataclass
class KVCache:
    """Preallocated talker K/V buffers plus per-slot valid lengths.

    ``lengths[slot]`` = number of positions written for the slot's current request (updated by
    :meth:`Talker.forward` on device, no host sync; informative — attention masks by position).
    """

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def allocate(
        cls, cfg: TalkerConfig, num_slots: int, max_len: int, device: torch.device | str, dtype: torch.dtype
    ) -> KVCache:
        """Zeroed buffers for ``num_slots`` concurrent requests of up to ``max_len`` positions.

        On CPU they are lazily committed (:func:`tts_common.memory.lazy_zeros`): positions no
        request reaches cost no memory. Elsewhere plain ``torch.zeros``.
        """
        assert cfg.head_dim is not None
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        return cls(
            k=lazy_zeros(shape, dtype, device),
            v=lazy_zeros(shape, dtype, device),
            lengths=torch.zeros(num_slots, device=device, dtype=torch.int64),
        )

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (one request
        moving to another slot; what lies past ``length`` is never read)."""
        n = min(length, self.max_len)
        self.k[:, dst, :, :n].copy_(self.k[:, src, :, :n])
        self.v[:, dst, :, :n].copy_(self.v[:, src, :, :n])
        self.lengths[dst] = self.lengths[src]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class TextProjection(nn.Module):
    """``Linear(text_hidden→text_hidden, bias) → SiLU → Linear(text_hidden→H, bias)``."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class TalkerBackbone(DecoderStack):
    """``talker.model``: text/codec embeddings, decoder layers, final norm."""

    def __init__(self, cfg: TalkerConfig) -> None:
        assert cfg.head_dim is not None
        super().__init__(
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.rope_theta,
            cfg.attention_bias,
        )
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class Talker(nn.Module):
    """``talker``: backbone, text projection, codec head and the code predictor."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, cfg.hidden_size)
        # Lazily built per device (not a buffer: meta-device construction would leave it garbage).
        self._suppress: dict[torch.device, torch.Tensor] = {}

    def suppress_mask(self, device: torch.device) -> torch.Tensor:
        """bool [vocab]: code0 ids never generated ([vocab-1024, vocab) except EOS, §7)."""
        mask = self._suppress.get(device)
        if mask is None:
            mask = suppress_mask(self.cfg.vocab_size, self.cfg.codec_eos_token_id, device)
            self._suppress[device] = mask
        return mask

    # --- embeddings (ARCHITECTURE.md §4 notation) ---------------------------------------------
    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``T(ids)``: text embedding then projection; ids [..., n] -> [..., n, H]."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``C(ids)``: the talker's codec embedding."""
        return self.model.codec_embedding(ids)

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """Σ of the 16 codebook embeddings of frames ``codes`` [N, G] -> [N, H].

        ``C(code_0) + Σ_i cp.codec_embedding[i-1](code_i)``, reduced with one ``sum`` over a
        stacked dimension in the reference's order (bit-exact with the official feedback sum).
        """
        parts = [self.codec_embed(codes[:, 0])]
        for i in range(1, codes.shape[1]):
            parts.append(self.code_predictor.model.codec_embedding[i - 1](codes[:, i]))
        return torch.stack(parts, dim=1).sum(dim=1)

    # --- transformer ----------------------------------------------------------------------------
    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: int | torch.Tensor | None,
        attend_len: int,
        in_place: InPlaceAttention | None = None,
    ) -> torch.Tensor:
        """Run new tokens through the talker, writing their K/V into the cache.

        inputs_embeds [B, S, H]; positions [B, S] (per-row cache/RoPE positions); ``slots``: see
        :class:`~talker_service.model.layers.AttentionSpec` (int = one slot, None = row b is slot
        b, tensor [B] = slot per row). ``attend_len`` (static) must be > every position.
        (Prompts go through :func:`~talker_service.model.step.prefill_prompts`, which attends
        each with SDPA's causal mode, the reference's unmasked prefill path.)
        ``in_place`` (one new token per row, rows = slots 0..B-1, ``attend_len`` = the slot
        length): row b attends to keys [0, positions[b] + 1) read in place from its slot
        (:mod:`.decode_attention`).
        Returns the final-norm hidden states [B, S, H] (``past_hidden`` source).
        """
        mask = None
        if in_place is not None:
            if slots is not None or positions.shape[1] != 1 or attend_len != cache.max_len:
                raise ValueError("in-place attention needs rows in slots 0..B-1, one token, the whole slot")
            in_place.set_lengths(positions[:, 0] + 1)
        else:
            key_pos = torch.arange(attend_len, device=positions.device)
            mask = (key_pos[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        spec = AttentionSpec(
            positions=positions,
            slots=slots,
            attend_len=attend_len,
            mask=mask,
            is_causal=False,
            in_place=in_place,
            prefix_only=in_place is None,  # the mask: key <= the token's own position
        )
        hidden = self.model.run_layers(inputs_embeds, cache.k, cache.v, spec)
        new_len = positions[:, -1] + 1
        if isinstance(slots, int):
            cache.lengths[slots : slots + 1] = new_len
        elif slots is None:
            cache.lengths[: positions.shape[0]] = new_len
        else:
            cache.lengths[slots] = new_len
        return hidden

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Codec-head logits (fp32) of final-norm hidden states [..., H] -> [..., vocab]."""
        return self.codec_head(hidden_last).to(torch.float32)
