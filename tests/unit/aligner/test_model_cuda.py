"""The aligner on CUDA (skipped without one): the fixture's official classes in float32, and
bfloat16 close to the official bfloat16 run; a batch equals each utterance alone.

On CUDA the convolutions may use TF32 (PyTorch's default for cuDNN), so logits drift from the CPU
reference more than on the CPU; a class may differ only where the official top-2 margin is below
that drift.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aligner_service.model import AlignInput, load_aligner

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "aligner"
CASES = json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))["cases"]


def case_input(name: str) -> AlignInput:
    case = CASES[name]
    pcm = np.load(FIXTURE / f"{name}.npz")["audio"]
    audio = pcm.astype(np.float32) / np.float32(32768.0) * np.float32(case["scale"])
    return AlignInput(audio=audio, sample_rate=case["sample_rate"], words=list(case["words"]))


def _check(logits: torch.Tensor, official: torch.Tensor, margins: list[float], rel: float) -> None:
    scale = float(official.abs().max())
    drift = float((logits - official).abs().max())
    assert drift <= rel * scale, (drift, scale)
    flipped = logits.argmax(-1) != official.argmax(-1)
    assert bool((torch.tensor(margins)[flipped] <= 2 * drift).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_official(dtype: torch.dtype) -> None:
    aligner = load_aligner(FIXTURE / "ckpt", device="cuda", dtype=dtype)
    assert aligner.device.type == "cuda" and aligner.dtype == dtype
    names = sorted(CASES)
    batched = aligner.timestamp_logits([case_input(n) for n in names])
    key, margins, rel = (
        ("logits", "margins", 1e-5) if dtype == torch.float32 else ("logits_bf16", "margins_bf16", 0.02)
    )
    for name, rows in zip(names, batched):
        official = torch.from_numpy(np.load(FIXTURE / f"{name}.npz")[key])
        alone = aligner.timestamp_logits([case_input(name)])[0]
        _check(alone, official, CASES[name][margins], rel)
        _check(rows, alone, alone.topk(2, -1).values.diff(dim=-1).neg().squeeze(-1).tolist(), rel)
