"""Mimi speech-tokenizer encoder: official ICL reference codes of tiny_base, key layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from speaker_service.model.codec_encoder import CodecEncoder
from tts_common.audio import read_audio_file
from tts_common.config import load_checkpoint_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CKPT = FIXTURES / "ckpt" / "tiny_base"
REF = FIXTURES / "reference" / "tiny_base"
ST_WEIGHTS = CKPT / "speech_tokenizer" / "model.safetensors"


def _code_cases() -> list[tuple[str, str]]:
    out = []
    for line in (REF / "requests.jsonl").read_text(encoding="utf-8").splitlines():
        req = json.loads(line)
        case, idx = req["id"].rsplit(".", 1)
        if (REF / case / f"ref_code_{idx}.npy").exists():
            out.append((req["ref_audio"], f"{case}/ref_code_{idx}.npy"))
    return out


def _encoder_keys() -> set[str]:
    with safe_open(str(ST_WEIGHTS), "pt") as fh:
        return {k for k in fh.keys() if k.startswith("encoder.")}


@pytest.fixture(scope="module")
def codec() -> CodecEncoder:
    return CodecEncoder.from_checkpoint(CKPT)


def test_cases_present() -> None:
    cases = _code_cases()
    assert len(cases) == 6 and {a for a, _ in cases} == {"ref_24k.wav", "ref_16k.wav"}


@pytest.mark.parametrize("ref_audio,expected", _code_cases())
def test_reference_codes_exact(codec: CodecEncoder, ref_audio: str, expected: str) -> None:
    wav = read_audio_file(str(REF / ref_audio))
    codes = codec.encode(wav)
    ref = np.load(REF / expected)
    assert codes.dtype == torch.int64 and tuple(codes.shape) == ref.shape == (25, 16)
    np.testing.assert_array_equal(codes.numpy(), ref)


def test_frames_cut_and_batch(codec: CodecEncoder) -> None:
    wav = torch.from_numpy(read_audio_file(str(REF / "ref_24k.wav")))
    for n in [1920, 1921, 5000, 24000]:
        assert codec.encode(wav[:n]).shape == (-(-n // 1920), 16)
    # Right zero-padding (official batch path, no padding mask) leaves the causal prefix intact.
    full, short = codec.encode_batch([wav, wav[:24000]])
    np.testing.assert_array_equal(full.numpy(), np.load(REF / "vc_batch2" / "ref_code_0.npy"))
    assert short.shape == (13, 16)
    assert codec.encode_batch([]) == []


def test_state_dict_keys_equal_checkpoint(codec: CodecEncoder) -> None:
    keys = _encoder_keys()
    assert set(codec.checkpoint_state_dict()) == keys
    # Nothing of the decoder half exists in the module.
    assert not any(k.startswith(("upsample", "decoder")) for k in codec.mimi.state_dict())


def test_random_state_dict_layout_and_use() -> None:
    cfg = load_checkpoint_config(CKPT).speech_tokenizer.encoder_config
    state = torch.random.get_rng_state()
    rnd = CodecEncoder.random_state_dict(cfg, seed=5, calibration_seconds=2.0)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert set(rnd) == _encoder_keys()
    with safe_open(str(ST_WEIGHTS), "pt") as fh:
        for k, v in rnd.items():
            assert tuple(v.shape) == tuple(fh.get_slice(k).get_shape()) and v.dtype == torch.float32, k
    again = CodecEncoder.random_state_dict(cfg, seed=5, calibration_seconds=2.0)
    assert all(torch.equal(rnd[k], again[k]) for k in rnd)
    # The calibrated codebooks give varied codes (all-zero codebooks would give only code 0).
    model = CodecEncoder(cfg)
    model.mimi.load_state_dict({k[len("encoder.") :]: v for k, v in rnd.items()}, strict=True)
    model.reset_codebook_cache()
    codes = model.eval().encode(read_audio_file(str(REF / "ref_24k.wav")))
    assert all(len(set(codes[:, q].tolist())) > 3 for q in range(16))


def test_bfloat16_runs(codec: CodecEncoder) -> None:
    bf = CodecEncoder.from_checkpoint(CKPT, dtype=torch.bfloat16)
    codes = bf.encode(read_audio_file(str(REF / "ref_24k.wav")))
    assert codes.shape == (25, 16) and codes.dtype == torch.int64
    # Casting resets Mimi's lazily cached codebook embeddings (else they would keep the old dtype).
    books = [m for m in bf.mimi.modules() if hasattr(m, "embed_sum")]
    assert books and all(b._embed is not None for b in books[:16])
    bf.to(torch.float32)
    assert all(b._embed is None for b in books)
