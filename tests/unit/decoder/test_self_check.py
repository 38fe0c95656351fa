"""The decoder's graph-path self-check (decoder_service.model.self_check): it passes on the
emulated graphs, detects a wrong step or a failed capture, and the batcher then runs eager."""

from __future__ import annotations

import pytest
import torch

from decoder_service.model import cuda_graphs
from decoder_service.model.decoder import CodecDecoder
from decoder_service.model.random_init import init_random_weights
from decoder_service.model.self_check import graph_tolerance, start_batcher
from decoder_service.model.streaming import DecoderSession
from tests.helpers.decoder import small_config
from tts_common.cuda_graphs import StepCapture
from tts_common.self_check import GraphPathError

BUCKETS = {"batch_buckets": (1, 2), "frame_buckets": (2, 3)}


@pytest.fixture(scope="module")
def small() -> CodecDecoder:
    return init_random_weights(CodecDecoder(small_config()), seed=7).eval()


def test_emulated_graphs_pass_the_startup_check(small: CodecDecoder) -> None:
    batcher, outcome = start_batcher(small, "auto", emulate=True, **BUCKETS)
    assert batcher.graphs is not None and outcome.report.passed
    assert [c.name for c in outcome.report.checks] == ["decoder.capture", "decoder.graph_vs_eager"]


def _eager_audio_equal(small: CodecDecoder, batcher: object) -> None:
    codes = torch.randint(0, small.config.codebook_size, (5, small.num_quantizers))
    got = batcher.advance([DecoderSession(small)], [codes])[0]  # type: ignore[attr-defined]
    want = DecoderSession(small).feed(codes)
    assert float((got - want).abs().max()) < 1e-5


def test_a_wrong_graph_step_falls_back_to_eager(small: CodecDecoder, monkeypatch: pytest.MonkeyPatch) -> None:
    right = cuda_graphs.CudaGraphSteps.step

    def wrong(self: object, *args: object) -> object:
        wav, state = right(self, *args)  # type: ignore[arg-type]
        return wav * 1.5, state

    monkeypatch.setattr(cuda_graphs.CudaGraphSteps, "step", wrong)
    batcher, outcome = start_batcher(small, "auto", emulate=True, **BUCKETS)
    assert batcher.graphs is None
    assert "decoder.graph_vs_eager" in outcome.fallback_reason
    _eager_audio_equal(small, batcher)
    with pytest.raises(GraphPathError, match="decoder.graph_vs_eager"):
        start_batcher(small, "on", emulate=True, **BUCKETS)


def test_a_capture_failure_falls_back_to_eager(small: CodecDecoder, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: StepCapture, name: str, step: object) -> None:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(StepCapture, "capture", fail)
    batcher, outcome = start_batcher(small, "auto", emulate=True, **BUCKETS)
    assert batcher.graphs is None and "decoder.capture: RuntimeError" in outcome.fallback_reason
    _eager_audio_equal(small, batcher)


def test_off_and_cpu_are_eager_without_checks(small: CodecDecoder) -> None:
    batcher, outcome = start_batcher(small, "auto", **BUCKETS)
    assert batcher.graphs is None and not outcome.report.checks and not outcome.fallback_reason
    with pytest.raises(ValueError, match="needs a cuda device"):
        start_batcher(small, "on", **BUCKETS)


def test_the_decoder_model_info_says_how_it_steps_and_its_stats_answer(tmp_path: object) -> None:
    import asyncio

    from decoder_service.config import DecoderConfig
    from decoder_service.server import DecoderServicer
    from tests.helpers.fixtures import CKPT_DIR

    servicer = DecoderServicer(
        str(CKPT_DIR / "tiny_custom_voice_1b7"), DecoderConfig(emulate_cuda_graphs=True)
    )

    async def load_and_ask() -> tuple[object, object]:
        await servicer.load()
        try:
            info = await servicer.GetModelInfo(None, None)  # type: ignore[arg-type]
            return info, await servicer.GetStats(None, None)  # type: ignore[arg-type]
        finally:
            await servicer.close()

    info, stats = asyncio.run(load_and_ask())
    assert info.step_path == "emulated-graphs" and info.fallback_reason == ""  # type: ignore[attr-defined]
    # The load report (the gateway's routing and the reliability tests poll it) still answers.
    assert stats.stage == "decoder" and stats.ready  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("dtype", "device", "tf32", "tolerance"),
    [
        (torch.float32, "cpu", True, 1e-4),  # the CPU has no TF32: rounding only
        (torch.float32, "cuda", False, 1e-4),
        (torch.float32, "cuda", True, 1e-2),  # an H200 measured 1.3e-3 here
        (torch.bfloat16, "cuda", True, 5e-2),
        (torch.bfloat16, "cpu", False, 5e-2),
    ],
)
def test_the_tolerance_allows_what_the_device_rounds_and_no_more(
    dtype: torch.dtype, device: str, tf32: bool, tolerance: float
) -> None:
    assert graph_tolerance(dtype, torch.device(device), tf32) == tolerance
    assert graph_tolerance(dtype, torch.device(device), tf32) < 0.5  # a fault of the audio's size fails


def test_a_tf32_sized_difference_still_fails_float32_on_the_cpu(
    small: CodecDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = cuda_graphs.CudaGraphSteps.step

    def off_by_tf32(self: object, *args: object) -> object:
        wav, state = right(self, *args)  # type: ignore[arg-type]
        return wav * (1 + 1.3e-3), state

    monkeypatch.setattr(cuda_graphs.CudaGraphSteps, "step", off_by_tf32)
    batcher, outcome = start_batcher(small, "auto", emulate=True, **BUCKETS)
    assert batcher.graphs is None and "decoder.graph_vs_eager" in outcome.fallback_reason
