"""``OfflineSynthesizer(max_batch=...)``: how many requests share one engine batch (benchmarks
measure a batch of 8 through it; the default is 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

import qwen3_tts.offline as offline
from qwen3_tts.offline import MAX_BATCH, OfflineRequest, OfflineSynthesizer
from tts_common.pb.qwen3tts.v1 import tts_pb2

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "ckpt" / "tiny_custom_voice"


@pytest.fixture(scope="module")
def synth() -> OfflineSynthesizer:
    return OfflineSynthesizer(CKPT)


@pytest.mark.parametrize("max_batch", [None, 2, 6])
def test_requests_share_an_engine_batch_up_to_max_batch(
    synth: OfflineSynthesizer, monkeypatch: pytest.MonkeyPatch, max_batch: int | None
) -> None:
    slots: list[int] = []
    engine = offline.TalkerEngine

    def recording_engine(talker, config):  # type: ignore[no-untyped-def]
        slots.append(config.max_slots)
        return engine(talker, config)

    monkeypatch.setattr(offline, "TalkerEngine", recording_engine)
    monkeypatch.setattr(synth, "max_batch", MAX_BATCH if max_batch is None else max_batch)
    requests = [OfflineRequest(id=f"r{i}", text="Hi.", speaker="ryan") for i in range(6)]
    results = synth.synthesize(requests, tts_pb2.SamplingOptions(seed=1, max_new_tokens=3))
    assert len(results) == 6 and all(r.wav.size > 0 for r in results)
    assert slots == [min(6, MAX_BATCH if max_batch is None else max_batch)]


def test_max_batch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch must be at least 1, got 0"):
        OfflineSynthesizer(CKPT, max_batch=0)
