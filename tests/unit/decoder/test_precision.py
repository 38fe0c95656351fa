"""Reduced-precision decoders: audio within the documented tolerance of float32, SnakeBeta in
float32, and the float32 path unchanged."""

from __future__ import annotations

import pytest
import torch

from decoder_service.model.convolutions import SnakeBeta
from decoder_service.model.loading import AUDIO_TOLERANCE, load_codec_decoder
from tests.helpers.decoder import fixture_cases
from tests.helpers.fixtures import CKPT_DIR

NAME = "tiny_voice_design"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_audio_is_within_the_documented_tolerance(dtype: torch.dtype) -> None:
    ref = load_codec_decoder(CKPT_DIR / NAME)
    low = load_codec_decoder(CKPT_DIR / NAME, dtype=dtype)
    assert low.dtype == dtype
    snakes = [m for m in low.modules() if isinstance(m, SnakeBeta)]
    assert snakes and all(m.alpha.dtype == m.beta.dtype == torch.float32 for m in snakes)
    for codes, _ref_codes, _wav, case in fixture_cases(NAME)[:1]:
        c = torch.from_numpy(codes[:24])  # 2 s of audio: enough frames for every layer's context
        with torch.inference_mode():
            wa, wb = ref.decode(c), low.decode(c)
        assert wb.dtype == torch.float32 and wb.shape == wa.shape and torch.isfinite(wb).all()
        rel = ((wb - wa).norm() / wa.norm()).item()
        # Not silence and not float32 bit-for-bit either: the bound is about rounding only.
        assert 0 < rel < AUDIO_TOLERANCE[dtype], (case, rel)


def test_snake_in_float32_whatever_the_input_dtype() -> None:
    snake = SnakeBeta(4)
    with torch.no_grad():
        snake.alpha.copy_(torch.tensor([0.0, 1.0, -1.0, 0.5]))
        snake.beta.copy_(torch.tensor([0.0, 12.0, -2.0, 1.0]))  # exp(12) overflows float16
    x = torch.randn(2, 4, 16)
    with torch.inference_mode():
        want = snake(x)
        for dtype in (torch.bfloat16, torch.float16):
            got = snake(x.to(dtype))
            assert got.dtype == dtype and torch.isfinite(got).all()
            # The only difference is the rounding of the input and of the result.
            assert torch.equal(got, snake(x.to(dtype).float()).to(dtype))
            assert torch.allclose(got.float(), want, rtol=2e-2, atol=5e-2)
