"""The code predictor: a small decoder that fills codebooks 1..15 of a frame (ARCHITECTURE.md §6).

Parameter names equal the checkpoint keys under ``talker.code_predictor.``.
"""

from __future__ import annotations

import torch
from torch import nn

from tts_common.config import CodePredictorConfig

from .layers import DecoderStack


class CodePredictorBackbone(DecoderStack):
    """``code_predictor.model``: layers, norm and the 15 codec embeddings (talker-hidden wide)."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
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
        # Embeddings of codebooks 1..G-1 live in the *talker* hidden size; every input is
        # projected by small_to_mtp_projection before entering the layers.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """``talker.code_predictor``: backbone, 15 lm_heads and the input projection."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        assert cfg.head_dim is not None
        self.cfg = cfg
        self.num_groups = cfg.num_code_groups
        self.model = CodePredictorBackbone(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        # Identity when the talker is as wide as the predictor (0.6B): no weights in the file.
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
            if talker_hidden != cfg.hidden_size
            else nn.Identity()
        )

    def new_cache(
        self, batch: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh per-frame cache: k, v of shape [layers, B, kv, num_code_groups, head_dim].

        A frame uses positions 0..G-1 (2 prefill positions + G-2 single steps); nothing is read
        beyond the written prefix, so the buffers need no clearing between frames.
        """
        c = self.cfg
        assert c.head_dim is not None
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, c.num_code_groups, c.head_dim)
        return torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype)
