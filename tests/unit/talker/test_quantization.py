"""--quantization int8 (weight-only, per-output-channel scales) and w8a8 (those weights and int8
activations per token) on the fixtures: the talker's logits stay close to float32's on the same
prompt; codes are not expected to match, so the
audio difference against float32 is reported (``pytest -s``) as the decoder's precision test
measures it (relative RMS of the waveform), with bfloat16 beside it for scale, and int8 in a
bfloat16 model (``--dtype auto --quantization int8`` on a CPU with bf16 arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder_service.model.loading import load_codec_decoder
from talker_service.model import TalkerModel
from tests.helpers.fixtures import CKPT_DIR, fixture_prompt_inputs, load_requests
from tests.helpers.talker import generate
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.candidates import FAMILIES, KernelLinear
from tts_common.kernels.choice import set_up_linears
from tts_common.synthesis import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NAME = "tiny_custom_voice"
LOGIT_TOLERANCE = 0.05
"""Relative L2 error of int8 and w8a8 prefill logits against float32 (int8 measured ~0.012 on the
fixtures, ~0.014 with bf16 activations; w8a8 in the test's comment)."""


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))


def _model(dtype: torch.dtype = torch.float32, quantization: str = "none") -> TalkerModel:
    m = TalkerModel.from_checkpoint(CKPT_DIR / NAME, dtype=dtype)
    set_up_linears(m.talker, m.device, m.dtype, "auto", quantization, (1, 2))
    return m


def _prefill_logits(m: TalkerModel, line: dict) -> torch.Tensor:
    prompt = m.build_prompt(fixture_prompt_inputs(NAME, line))
    x = prompt.prefill.unsqueeze(0)
    n = x.shape[1]
    cache = m.allocate_cache(1, n + 1)
    with torch.inference_mode():
        hidden = m.talker(x, torch.arange(n)[None], cache, 0, n)  # every position's logits
        return m.talker.logits(hidden[0])


@pytest.mark.parametrize("quantization", ["int8", "w8a8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_logits_stay_close_to_float32(dtype: torch.dtype, quantization: str) -> None:
    # In a bfloat16 model (--dtype auto on a CPU with bf16 arithmetic) too: int8 measured ~0.014
    # against float32's logits, where bfloat16 alone is ~0.006; w8a8 (int8 activations too)
    # ~0.018 (torch-w8a8 where our kernel is missing: the same bits as gemv-w8a8).
    ref, low = _model(), _model(dtype, quantization=quantization)
    kernels = {mod.kernel for mod in low.talker.modules() if isinstance(mod, KernelLinear)}
    assert kernels and kernels <= set(FAMILIES[quantization])
    for line in load_requests(NAME)[:3]:
        want, got = _prefill_logits(ref, line), _prefill_logits(low, line).float()
        rel = ((got - want).norm() / want.norm()).item()
        # Not float32 (the weights are rounded), and within the quantization's error.
        assert 0 < rel < LOGIT_TOLERANCE, (line["id"], rel)


def test_audio_difference_against_float32_is_reported() -> None:
    decoder = load_codec_decoder(CKPT_DIR / NAME)
    line = load_requests(NAME)[0]
    source = fixture_prompt_inputs(NAME, line)
    params = SamplingParams.greedy(1.05)
    runs = {
        "float32": _model(),
        "int8": _model(quantization="int8"),
        "bfloat16": _model(torch.bfloat16),
        # --dtype auto --quantization int8 where auto is bf16 (gemv-int8dp where the choice keeps it)
        "bfloat16+int8": _model(torch.bfloat16, "int8"),
        "w8a8": _model(quantization="w8a8"),
        "bfloat16+w8a8": _model(torch.bfloat16, "w8a8"),
    }
    codes = {name: generate(m, [source], 24, params)[0].codes for name, m in runs.items()}
    with torch.inference_mode():
        wavs = {name: decoder.decode(torch.from_numpy(c)) for name, c in codes.items()}
    for name in ("int8", "bfloat16", "bfloat16+int8", "w8a8", "bfloat16+w8a8"):
        frames = min(len(codes[name]), len(codes["float32"]))
        same = float(np.mean(codes[name][:frames] == codes["float32"][:frames])) if frames else 0.0
        n = min(wavs[name].shape[-1], wavs["float32"].shape[-1])
        a, b = wavs["float32"][..., :n], wavs[name][..., :n]
        rel = ((b - a).norm() / a.norm()).item()
        print(
            f"\n{NAME} {line['id']}: {name} vs float32: {frames} frames, {same:.0%} of codes equal, audio rel RMS {rel:.3f}"
        )
        assert torch.isfinite(wavs[name]).all() and b.norm() > 0, name
