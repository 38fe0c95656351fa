"""Decoder test helpers: the fixture tolerance, the fixture cases, a small random config and the
compiled SnakeBeta's tolerance."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.fixtures import REFERENCE_DIR, load_requests
from tts_common.config import CodecDecoderConfig

TOL = 1e-4


def is_icl(req: dict) -> bool:
    """Voice clone in-context mode: the official decodes ``ref_code ‖ codes`` and cuts the ref part."""
    return "ref_text" in req and not req.get("x_vector_only", False)


def fixture_cases(name: str) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray, str]]:
    """(codes [T, 16], ref_codes or None, expected wav, id) of every request of checkpoint ``name``."""
    out = []
    for req in load_requests(name):
        codes_rel = req["expect"]["codes"]
        codes = np.load(REFERENCE_DIR / name / codes_rel)
        wav = np.load(REFERENCE_DIR / name / req["expect"]["wav"])
        ref = (
            np.load(REFERENCE_DIR / name / codes_rel.replace("codes_", "ref_code_")) if is_icl(req) else None
        )
        out.append((codes, ref, wav, req["id"]))
    return out


def small_config(**overrides: object) -> CodecDecoderConfig:
    base: dict = {
        "codebook_dim": 16,
        "codebook_size": 64,
        "hidden_size": 32,
        "latent_dim": 24,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_hidden_layers": 2,
        "sliding_window": 5,
        "upsample_rates": [3, 2],
        "upsampling_ratios": [2],
        "decoder_dim": 16,
    }
    base.update(overrides)
    return CodecDecoderConfig(**base)


def snake_tolerance(want: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """How far the compiled SnakeBeta (tts_common.kernels.snake) may be from torch's float32
    formula ``want``: two ulps of the result plus a few of the sine's square (at most 1) times
    its channel's ``inv_beta`` [C]."""
    return want.float().abs() * 2.0**-22 + inv_beta[None, :, None].abs() * 2.0**-21
