"""A batch aligns every utterance as it is aligned alone (property test over random inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aligner_service.model import AlignInput, ForcedAligner, load_aligner

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "aligner"
WORDS = [
    "hello",
    "world",
    "don't",
    "Straße",
    "iPhone",
    "7",
    "今",
    "天",
    "東京",
    "タワー",
    "안녕",
    "학생입니다",
]


@pytest.fixture(scope="module")
def aligner() -> ForcedAligner:
    return load_aligner(FIXTURE / "ckpt")


@st.composite
def align_inputs(draw: st.DrawFn) -> AlignInput:
    rate = draw(st.sampled_from([8000, 16000, 22050, 24000, 44100]))
    # 0.05 s .. 1.3 s, lengths not aligned to the 160-sample hop nor to the 100-frame chunks
    samples = draw(st.integers(min_value=int(0.05 * rate), max_value=int(1.3 * rate)))
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    amplitude = draw(st.sampled_from([0.01, 0.5, 3.0]))
    audio = (np.random.default_rng(seed).standard_normal(samples) * amplitude).astype(np.float32)
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
    return AlignInput(audio=audio, sample_rate=rate, words=words)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(align_inputs(), min_size=2, max_size=4))
def test_batch_equals_each_alone(aligner: ForcedAligner, batch: list[AlignInput]) -> None:
    batched = aligner.timestamp_logits(batch)
    for item, logits in zip(batch, batched):
        alone = aligner.timestamp_logits([item])[0]
        # the audio side is computed per utterance (identical); the text model's padded batch may
        # differ in the last bits only
        drift = float((logits - alone).abs().max())
        assert drift <= 1e-5 * float(alone.abs().max())
        top2 = alone.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        flipped = logits.argmax(-1) != alone.argmax(-1)
        # a class may differ only at a near tie that the drift can explain
        assert bool((margin[flipped] <= 2 * drift).all())
    assert aligner.predict_classes(batch) == [b.argmax(-1).tolist() for b in batched]


def test_padding_rows_do_not_change_positions(aligner: ForcedAligner) -> None:
    """Left padding: the short utterance's logits with a long neighbour equal its logits alone
    (RoPE positions restart at 0 after the padding)."""
    rng = np.random.default_rng(7)
    short = AlignInput(rng.standard_normal(4000).astype(np.float32) * 0.3, 16000, ["a", "b"])
    long = AlignInput(rng.standard_normal(20000).astype(np.float32) * 0.3, 16000, WORDS)
    alone = aligner.timestamp_logits([short])[0]
    both = aligner.timestamp_logits([long, short])[1]
    torch.testing.assert_close(both, alone, rtol=0, atol=1e-5 * float(alone.abs().max()))
