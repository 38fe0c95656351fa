"""Parity of aligner_service.model with the official Qwen3ForcedAligner (qwen-asr 0.0.6).

The fixture (tests/fixtures/aligner, built by scripts/aligner_fixtures.py in the official
environment) is a tiny checkpoint in the released layout whose weights make the timestamp classes
vary across words, and the official outputs for English, Chinese, Japanese, Korean and German
utterances (inputs at 16, 22.05, 24 and 44.1 kHz, one stereo and above full scale, one 8.5 s long
so that it spans several convolution chunks and more than one ``n_window_infer`` window).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from aligner_service.model import AlignInput, ForcedAligner, load_aligner

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "aligner"
CASES: dict[str, dict[str, Any]] = json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))["cases"]


def case_input(name: str) -> AlignInput:
    """The case's input exactly as the official code received it (int16 PCM / 32768, scaled)."""
    case = CASES[name]
    pcm = np.load(FIXTURE / f"{name}.npz")["audio"]
    audio = pcm.astype(np.float32) / np.float32(32768.0) * np.float32(case["scale"])
    return AlignInput(audio=audio, sample_rate=case["sample_rate"], words=list(case["words"]))


@pytest.fixture(scope="module")
def aligner() -> ForcedAligner:
    return load_aligner(FIXTURE / "ckpt")


@pytest.fixture(scope="module")
def aligner_bf16() -> ForcedAligner:
    return load_aligner(FIXTURE / "ckpt", dtype=torch.bfloat16)


def test_fixture_covers_the_languages_and_varies() -> None:
    languages = {c["language"] for c in CASES.values()}
    assert {"English", "Chinese", "Japanese", "Korean", "German"} <= languages
    for name, case in CASES.items():
        # the deliberate weight structure: classes spread over the words (not one time for all)
        assert len(set(case["classes"])) >= 4, name
        # no near tie in the official logits: parity of the argmax is a fair test
        assert min(case["margins"]) > 1e-3, name


def test_aligner_attributes(aligner: ForcedAligner) -> None:
    assert aligner.sample_rate == 16000
    assert aligner.timestamp_resolution_ms == 80.0
    assert aligner.max_audio_seconds == 256 * 0.08  # the fixture's 256 classes reach 20.48 s
    assert aligner.device == torch.device("cpu") and aligner.dtype == torch.float32
    assert aligner.model_name == "ckpt" and aligner.num_classes == 256


FEATURE_ATOL = 5e-5
"""Log-mel features against the official processor's, across CPU models (see below)."""


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_official_float32(aligner: ForcedAligner, name: str) -> None:
    case = CASES[name]
    expected = np.load(FIXTURE / f"{name}.npz")
    item = case_input(name)
    prompt = aligner.prepare(item)
    assert prompt.input_ids == expected["input_ids"].tolist()
    if "features" in expected:
        # soxr HQ resampling + Whisper log-mel (per utterance) as the official processor. The
        # oracle was recorded on a Zen 4: on a Xeon (family 6 model 167) float32 FFT rounding
        # moves a log-mel value by up to 1.5e-5 (1 of 25600), so the bound is 5e-5.
        np.testing.assert_allclose(prompt.features, expected["features"], rtol=0, atol=FEATURE_ATOL)
    assert prompt.features.shape[1] == case["mel_frames"]
    logits = aligner.logits_for_prompts([prompt])[0]
    official = torch.from_numpy(expected["logits"])
    assert logits.shape == official.shape == (2 * len(case["words"]), 256)
    torch.testing.assert_close(logits, official, rtol=0, atol=1e-6 * float(official.abs().max()))
    assert aligner.predict_classes([item]) == [case["classes"]]


@pytest.mark.parametrize("name", ["english", "korean", "long"])
def test_matches_official_bfloat16(aligner_bf16: ForcedAligner, name: str) -> None:
    case = CASES[name]
    official = torch.from_numpy(np.load(FIXTURE / f"{name}.npz")["logits_bf16"])
    logits = aligner_bf16.timestamp_logits([case_input(name)])[0]
    assert aligner_bf16.dtype == torch.bfloat16
    # bf16 logits are coarse (ties happen, margins_bf16 has zeros): the argmax of equal logits is
    # the same index, so equal logits mean equal classes.
    torch.testing.assert_close(logits, official, rtol=0, atol=0.02 * float(official.abs().max()))
    same = logits.argmax(-1) == torch.tensor(case["classes_bf16"])
    assert bool(same[torch.tensor(case["margins_bf16"]) > 0.05 * float(official.abs().max())].all())
    assert bool(same.float().mean() >= 0.9)


def test_batch_of_all_cases_gives_each_alone(aligner: ForcedAligner) -> None:
    names = sorted(CASES)
    assert aligner.predict_classes([case_input(n) for n in names]) == [CASES[n]["classes"] for n in names]


def test_official_batch_features_differ_from_alone() -> None:
    """Why we compute features per utterance: the official processor computes a batch's log-mel
    features on waveforms zero-padded to the longest, so a shorter utterance's logits move
    (most for one whose length is not a multiple of the 160-sample hop: one frame more)."""
    moved = {n: c["official_batch_max_logit_diff"] for n, c in CASES.items()}
    assert moved["long"] == 0.0  # the longest is not padded
    assert moved["korean"] > max(v for n, v in moved.items() if n != "korean") > 0.0
