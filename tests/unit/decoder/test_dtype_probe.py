"""The decoder's step for --dtype auto on CPU: a streamed chunk of every session through the
checkpoint's own decoder in each dtype, the decoder loaded once per dtype."""

from __future__ import annotations

import math

import pytest
import torch

from decoder_service.model import dtype_probe
from decoder_service.model.loading import load_codec_decoder
from tests.helpers.fixtures import CKPT_DIR
from tts_common.auto_dtype import CANDIDATES, measured_cpu_dtype, probe_cache_path
from tts_common.kernels.cache import CACHE_ENV

CKPT = CKPT_DIR / "tiny_custom_voice"


def test_the_probe_times_a_chunk_of_every_session_loading_each_dtype_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    loads: list[torch.dtype] = []
    chunks: list[tuple[int, tuple[int, ...]]] = []

    def load(path: object, device: object, dtype: torch.dtype) -> object:
        loads.append(dtype)
        return load_codec_decoder(path, device, dtype)  # type: ignore[arg-type]

    advance = dtype_probe.advance_sessions

    def counted(sessions: list, codes: list) -> list:
        chunks.append((len(sessions), tuple(codes[0].shape)))
        assert {s.decoder.dtype for s in sessions} == {sessions[0].decoder.dtype}
        return advance(sessions, codes)

    monkeypatch.setattr(dtype_probe, "load_codec_decoder", load)
    monkeypatch.setattr(dtype_probe, "advance_sessions", counted)
    probe = dtype_probe.checkpoint_decoder_probe(CKPT)
    assert probe.stage == "decoder" and probe.buckets == (1, 8)
    assert f"{dtype_probe.STEP_FRAMES}-frame chunk" in probe.what
    for dtype in CANDIDATES:  # one dtype at a time, as tts_common.auto_dtype times them
        for rows in probe.buckets:
            seconds = probe.step_seconds(dtype, rows)
            assert math.isfinite(seconds) and seconds > 0
    assert loads == [torch.float32, torch.bfloat16]  # once per dtype, kept for every row count
    # Per timing: a first chunk (the sessions' left context), then the timed one, of every row.
    q = load_codec_decoder(CKPT).num_quantizers
    expected = [
        (rows, (dtype_probe.STEP_FRAMES, q)) for _ in CANDIDATES for rows in probe.buckets for _ in "ab"
    ]
    assert chunks == expected
    probe.step_seconds("float32", 1)
    assert loads == [torch.float32, torch.bfloat16, torch.float32]  # the bf16 decoder was dropped
    assert measured_cpu_dtype(probe) in CANDIDATES and probe.key in probe_cache_path().read_text()
