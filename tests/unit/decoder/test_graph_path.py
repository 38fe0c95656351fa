"""The decoder's graph path on CPU (``SessionBatcher(emulate_cuda_graphs=True)``): every
(batch, frames) bucket captured at construction, largest first; streams through it (bucket
switches, padded rows and frames, split chunks) equal solo eager streaming within tolerance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoder_service.model.decoder import CodecDecoder
from decoder_service.model.random_init import init_random_weights
from decoder_service.model.streaming import DecoderSession, SessionBatcher
from tests.helpers.decoder import small_config

EXACT = 1e-5  # float32: different matmul shapes only


@pytest.fixture(scope="module")
def small() -> CodecDecoder:
    return init_random_weights(CodecDecoder(small_config()), seed=7).eval()


@pytest.fixture(scope="module")
def batcher(small: CodecDecoder) -> SessionBatcher:
    return SessionBatcher(small, batch_buckets=(1, 2, 4), frame_buckets=(2, 5), emulate_cuda_graphs=True)


def test_every_bucket_is_captured_at_construction_largest_first(batcher: SessionBatcher) -> None:
    assert batcher.graphs is not None
    names = batcher.graphs.report.names
    assert names[0] == "decoder[B=4,F=5]" and len(names) == 6 == len(batcher.graphs.captured)
    sizes = [int(n.split("B=")[1].split(",")[0]) * int(n.split("F=")[1].rstrip("]")) for n in names]
    assert sizes == sorted(sizes, reverse=True)


def test_uncaptured_shape_is_refused(batcher: SessionBatcher) -> None:
    assert batcher.graphs is not None
    dec = batcher.decoder
    codes = torch.zeros(3, dec.num_quantizers, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="no graph"):
        batcher.graphs.step(codes, torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.long), {})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 1000))
def test_graph_path_streams_equal_solo_eager(batcher: SessionBatcher, data: st.DataObject, seed: int) -> None:
    small = batcher.decoder
    assert batcher.graphs is not None
    replays_before = sum(c.replays for c in batcher.graphs.captured.values())
    n_streams = data.draw(st.integers(1, 4), label="streams")
    gen = torch.Generator().manual_seed(seed)
    codes = [
        torch.randint(0, small.config.codebook_size, (30, small.num_quantizers), generator=gen)
        for _ in range(n_streams)
    ]
    graphed = [DecoderSession(small) for _ in range(n_streams)]
    solo = [DecoderSession(small) for _ in range(n_streams)]
    pos = [0] * n_streams
    for _ in range(data.draw(st.integers(1, 4), label="steps")):
        active = [i for i in range(n_streams) if data.draw(st.booleans(), label="active")] or [0]
        sizes = {i: data.draw(st.integers(0, 7), label="n") for i in active}  # 7 > 5: split chunks
        chunks = [codes[i][pos[i] : pos[i] + sizes[i]] for i in active]
        outs = batcher.advance([graphed[i] for i in active], chunks)
        for i, chunk, out in zip(active, chunks, outs):
            ref = solo[i].feed(chunk)
            assert out.shape == ref.shape
            if ref.numel():
                assert float((out - ref).abs().max()) < EXACT
            pos[i] += int(chunk.shape[0])
    for g, s in zip(graphed, solo):
        assert g.position == s.position
    if any(pos):
        assert sum(c.replays for c in batcher.graphs.captured.values()) > replays_before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_cuda_graphs_equal_emulation_on_the_gpu() -> None:
    """Real CUDA graphs against the emulation on the same GPU (same buckets and padding)."""
    dec = init_random_weights(CodecDecoder(small_config()), seed=7).eval().to("cuda")
    buckets = {"batch_buckets": (1, 2, 4), "frame_buckets": (2, 5)}
    real = SessionBatcher(dec, use_cuda_graphs=True, **buckets)  # type: ignore[arg-type]
    emulated = SessionBatcher(dec, use_cuda_graphs=False, emulate_cuda_graphs=True, **buckets)  # type: ignore[arg-type]
    assert real.graphs is not None and real.graphs.report.mode == "cuda"
    assert real.graphs.report.names == emulated.graphs.report.names  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(0)
    codes = [
        torch.randint(0, dec.config.codebook_size, (20, dec.num_quantizers), generator=gen) for _ in range(3)
    ]
    a, b = [DecoderSession(dec) for _ in range(3)], [DecoderSession(dec) for _ in range(3)]
    pos = 0
    for active, n in (([0, 1, 2], 4), ([0], 1), ([1, 2], 7), ([0, 1, 2], 5)):
        chunks = [codes[i][pos : pos + n].cuda() for i in active]
        outs_real = real.advance([a[i] for i in active], chunks)
        outs_emulated = emulated.advance([b[i] for i in active], chunks)
        for x, y in zip(outs_real, outs_emulated):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
        pos += n


def test_static_state_is_shared_per_batch_size_and_counted(batcher: SessionBatcher) -> None:
    graphs = batcher.graphs
    assert graphs is not None
    buckets = graphs._buckets
    assert buckets[(2, 2)].state is buckets[(2, 5)].state
    assert buckets[(2, 2)].state is not buckets[(4, 2)].state
    state_bytes = {
        b: sum(t.numel() * t.element_size() for t in buckets[(b, 2)].state.values()) for b in (1, 2, 4)
    }
    assert sum(state_bytes.values()) < graphs.static_bytes < 2 * sum(state_bytes.values()) + 10**6
