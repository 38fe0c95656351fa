"""VoiceCloneFrontEnd: the combined API used by the speaker service and the offline CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from speaker_service.model import VoiceCloneFrontEnd
from tts_common.audio import load_audio
from tts_common.config import CheckpointError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REF = FIXTURES / "reference" / "tiny_base"


def test_frontend_reproduces_fixture() -> None:
    fe = VoiceCloneFrontEnd.from_checkpoint(FIXTURES / "ckpt" / "tiny_base")
    assert fe.sample_rate == 24000 and fe.embedding_dim == 64 and fe.num_quantizers == 16
    wav = load_audio((REF / "ref_16k.wav").read_bytes(), target_sample_rate=fe.sample_rate)
    emb = fe.embed(wav)
    assert emb.dtype == torch.float32 and emb.device.type == "cpu"
    np.testing.assert_allclose(
        emb.numpy(), np.load(REF / "vc_icl_ref16k" / "spk_emb_0.npy"), atol=1e-4, rtol=0
    )
    np.testing.assert_array_equal(
        fe.encode_reference(wav).numpy(), np.load(REF / "vc_icl_ref16k" / "ref_code_0.npy")
    )
    prompt = fe.prompt(wav, x_vector_only=True)
    assert prompt.ref_codes is None and torch.equal(prompt.speaker_embedding, emb)
    assert fe.prompt(wav).ref_codes.shape == (25, 16)  # type: ignore[union-attr]


def test_frontend_needs_base_checkpoint() -> None:
    with pytest.raises(CheckpointError, match="needs a Base checkpoint"):
        VoiceCloneFrontEnd.from_checkpoint(FIXTURES / "ckpt" / "tiny_voice_design")
