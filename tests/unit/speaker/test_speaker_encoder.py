"""Mel front end + ECAPA speaker encoder against the official x-vectors of tiny_base."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from speaker_service.model.mel import LogMelSpectrogram, hz_to_mel, mel_to_hz, slaney_mel_filterbank
from speaker_service.model.speaker_encoder import SpeakerEncoder
from tts_common.audio import read_audio_file
from tts_common.config import CheckpointError, SpeakerEncoderConfig, load_checkpoint_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CKPT = FIXTURES / "ckpt" / "tiny_base"
REF = FIXTURES / "reference" / "tiny_base"


def _spk_cases() -> list[tuple[str, str]]:
    """(reference audio file, expected spk_emb path) for every tiny_base utterance that has one."""
    out = []
    for line in (REF / "requests.jsonl").read_text(encoding="utf-8").splitlines():
        req = json.loads(line)
        case, idx = req["id"].rsplit(".", 1)
        emb = REF / case / f"spk_emb_{idx}.npy"
        if emb.exists():
            out.append((req["ref_audio"], f"{case}/spk_emb_{idx}.npy"))
    return out


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    return SpeakerEncoder.from_checkpoint(CKPT)


def test_cases_cover_both_rates() -> None:
    refs = {a for a, _ in _spk_cases()}
    assert refs == {"ref_24k.wav", "ref_16k.wav"} and len(_spk_cases()) == 7


@pytest.mark.parametrize("ref_audio,expected", _spk_cases())
def test_embedding_matches_official(encoder: SpeakerEncoder, ref_audio: str, expected: str) -> None:
    wav = read_audio_file(str(REF / ref_audio))  # soundfile float32, soxr HQ to 24 kHz
    emb = encoder.embed(wav)
    ref = np.load(REF / expected)
    assert emb.shape == (64,) and emb.dtype == torch.float32
    np.testing.assert_allclose(emb.numpy(), ref, atol=1e-4, rtol=0)


def test_state_dict_keys_equal_checkpoint(encoder: SpeakerEncoder) -> None:
    with safe_open(str(CKPT / "model.safetensors"), "pt") as fh:
        keys = {k for k in fh.keys() if k.startswith("speaker_encoder.")}
    assert set(encoder.checkpoint_state_dict()) == keys
    rnd = SpeakerEncoder.random_state_dict(load_checkpoint_config(CKPT).model.speaker_encoder, seed=3)
    assert set(rnd) == keys
    with safe_open(str(CKPT / "model.safetensors"), "pt") as fh:
        for k in keys:
            assert tuple(rnd[k].shape) == tuple(fh.get_slice(k).get_shape())


def test_random_state_dict_is_seeded_and_leaves_global_rng() -> None:
    cfg = SpeakerEncoderConfig(
        enc_dim=16, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_se_channels=8
    )
    state = torch.random.get_rng_state()
    a = SpeakerEncoder.random_state_dict(cfg, seed=1)
    b = SpeakerEncoder.random_state_dict(cfg, seed=1)
    c = SpeakerEncoder.random_state_dict(cfg, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_not_base_checkpoint_raises() -> None:
    with pytest.raises(CheckpointError, match="not a Base checkpoint"):
        SpeakerEncoder.from_checkpoint(FIXTURES / "ckpt" / "tiny_custom_voice")


def test_bfloat16_runs_and_is_close(encoder: SpeakerEncoder) -> None:
    wav = read_audio_file(str(REF / "ref_24k.wav"))
    bf = SpeakerEncoder.from_checkpoint(CKPT, dtype=torch.bfloat16)
    out = bf.embed(wav)
    assert out.dtype == torch.bfloat16 and out.shape == (64,)
    ref = encoder.embed(wav)
    cos = torch.nn.functional.cosine_similarity(out.float(), ref, dim=0)
    assert cos > 0.99


def test_short_audio_and_batch(encoder: SpeakerEncoder) -> None:
    wav = torch.from_numpy(read_audio_file(str(REF / "ref_24k.wav")))
    assert encoder.embed(wav[:2400]).shape == (64,)  # 0.1 s, the shortest accepted reference
    with torch.inference_mode():
        mels = encoder.mel(torch.stack([wav[:24000], wav[24000:]]))
        batch = encoder(mels)
    torch.testing.assert_close(batch[0], encoder.embed(wav[:24000]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="mono"):
        encoder.embed(wav.view(2, -1))


def test_mel_shapes_and_frames() -> None:
    mel = LogMelSpectrogram()
    for n in [2400, 24000, 48000, 12345]:
        out = mel(torch.zeros(n))
        assert out.shape == (1, (n + 2 * 384 - 1024) // 256 + 1, 128)
    assert torch.allclose(mel(torch.zeros(4000)), torch.tensor(float(np.log(1e-5))))
    with pytest.raises(ValueError, match="too short"):
        mel(torch.zeros(300))


def test_mel_scale_roundtrip_and_slaney_breakpoint() -> None:
    f = np.array([0.0, 200.0, 999.0, 1000.0, 4000.0, 12000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(f)), f, rtol=1e-12, atol=1e-9)
    assert hz_to_mel(np.float64(1000.0)) == pytest.approx(15.0)
    assert hz_to_mel(np.float64(6400.0)) == pytest.approx(15.0 + 27.0)


def test_filterbank_properties() -> None:
    fb = slaney_mel_filterbank(24000, 1024, 128, 0.0, 12000.0)
    assert fb.shape == (128, 513) and fb.dtype == np.float32
    assert (fb >= 0).all() and (fb.sum(axis=1) > 0).all()
    # Slaney normalisation: each triangle integrates (in Hz) to ~1.
    bin_hz = 24000 / 1024
    area = fb.sum(axis=1) * bin_hz
    assert np.median(area) == pytest.approx(1.0, rel=0.05)
    # Peaks rise monotonically with the mel index.
    peaks = fb.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all()
