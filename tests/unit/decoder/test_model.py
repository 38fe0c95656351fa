"""Whole-utterance speech-tokenizer decoder: strict loading and the official fixture waveforms."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from decoder_service.model.decoder import CodecDecoder, icl_cut
from decoder_service.model.loading import CHECKPOINT_PREFIX, load_codec_decoder
from decoder_service.model.random_init import init_random_weights
from tests.helpers.decoder import TOL, fixture_cases, small_config
from tests.helpers.fixtures import CHECKPOINT_NAMES, CKPT_DIR, REFERENCE_DIR


@pytest.fixture(scope="module", params=CHECKPOINT_NAMES)
def fixture_decoder(request: pytest.FixtureRequest) -> tuple[str, CodecDecoder]:
    return request.param, load_codec_decoder(CKPT_DIR / request.param)


def test_parameter_names_equal_checkpoint_keys() -> None:
    path = CKPT_DIR / "tiny_base" / "speech_tokenizer" / "model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        keys = {k[len(CHECKPOINT_PREFIX) :] for k in fh.keys() if k.startswith(CHECKPOINT_PREFIX)}
    dec = load_codec_decoder(CKPT_DIR / "tiny_base")
    assert set(dec.state_dict().keys()) == keys
    assert "quantizer.rvq_first.input_proj.weight" in keys  # unused by decoding, still loaded


def test_loads_from_speech_tokenizer_dir_and_bf16() -> None:
    a = load_codec_decoder(CKPT_DIR / "tiny_base")
    b = load_codec_decoder(CKPT_DIR / "tiny_base" / "speech_tokenizer", dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16
    codes = torch.from_numpy(np.load(REFERENCE_DIR / "tiny_base" / "vc_icl_stream" / "codes_0.npy"))[:12]
    wa, wb = a.decode(codes), b.decode(codes)
    assert wb.dtype == torch.float32 and wb.shape == wa.shape == (12 * 1920,)
    assert torch.isfinite(wb).all()
    assert torch.corrcoef(torch.stack([wa, wb]))[0, 1] > 0.9


def test_fixture_waveforms(fixture_decoder: tuple[str, CodecDecoder]) -> None:
    name, dec = fixture_decoder
    for codes, ref, wav, case in fixture_cases(name):
        if ref is None:
            out = dec.decode(torch.from_numpy(codes))
        else:
            out = dec.decode_utterances([torch.from_numpy(codes)], [torch.from_numpy(ref)])[0]
        assert out.dtype == torch.float32
        assert out.shape == wav.shape, case
        err = float(np.abs(out.numpy() - wav).max())
        assert err < TOL, f"{name}/{case}: max abs error {err}"


def test_batched_utterances_with_padding() -> None:
    """The official batch path: right-pad with -1, decode, crop each item (ICL cut per item)."""
    dec = load_codec_decoder(CKPT_DIR / "tiny_base")
    cases = [c for c in fixture_cases("tiny_base") if c[3].startswith("vc_batch2")]
    outs = dec.decode_utterances(
        [torch.from_numpy(c[0]) for c in cases], [torch.from_numpy(c[1]) for c in cases]
    )
    for (_, _, wav, case), out in zip(cases, outs):
        assert out.shape == wav.shape, case
        assert float(np.abs(out.numpy() - wav).max()) < TOL, case


def test_icl_cut_matches_official_float_arithmetic() -> None:
    assert icl_cut(25, 82, 82 * 1920) == 25 * 1920
    assert icl_cut(1, 49, 49 * 1920) == 1920 - 1  # float rounding keeps one reference sample


def test_shapes_padding_and_official_chunking() -> None:
    dec = init_random_weights(CodecDecoder(small_config()), seed=3).eval()
    spf = dec.samples_per_frame
    assert spf == 12
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 64, (2, 16, 340), generator=gen)
    whole = dec.decode(codes)
    assert whole.shape == (2, 340 * spf)
    single = dec.decode(codes[0].t())  # [T, Q] input -> 1-D output
    assert single.shape == whole[0].shape and (single - whole[0]).abs().max() < 1e-5

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and float((a - b).abs().max()) < 1e-5

    # <= 300 frames: chunked_decode is the exact decode
    assert torch.equal(dec.decode_official_chunked(codes[..., :300]), dec.decode(codes[..., :300]))
    # > 300 frames: the second chunk restarts from frame 275 and drops 25 frames of audio
    chunked = dec.decode_official_chunked(codes)
    assert close(chunked[:, : 300 * spf], whole[:, : 300 * spf])
    assert close(chunked[:, 300 * spf :], dec.decode(codes[..., 275:])[:, 25 * spf :])
    # -1 padding decodes as code 0, causal: the valid prefix is unaffected by what follows
    padded = codes.clone()
    padded[1, :, 200:] = -1
    out = dec.decode(padded)
    zeroed = padded.clamp(min=0)
    assert torch.equal(out, dec.decode(zeroed))
    assert (out[1, : 200 * spf] - whole[1, : 200 * spf]).abs().max() < 1e-5


def test_config_dims_follow_checkpoint() -> None:
    with open(CKPT_DIR / "tiny_base" / "speech_tokenizer" / "config.json", encoding="utf-8") as fh:
        cfg = json.load(fh)["decoder_config"]
    dec = load_codec_decoder(CKPT_DIR / "tiny_base")
    assert dec.samples_per_frame == 1920
    assert dec.decoder[-1].conv.in_channels == cfg["decoder_dim"] // 16
    assert len(dec.pre_transformer.layers) == cfg["num_hidden_layers"]
