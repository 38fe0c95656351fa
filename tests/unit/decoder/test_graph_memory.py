"""The decoder's graph memory bound (``--graph-memory``), on CPU with the emulated graph path.

In emulation the graphs hold their static inputs and outputs only (no activations, no pool), so
the bound is checked against those counted bytes; on CUDA the pool's measured growth replaces the
outputs (see decoder_service.model.cuda_graphs)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from decoder_service.config import DEFAULT_GRAPH_MEMORY, FLAGS, DecoderConfig, decoder_config_from_args
from decoder_service.model.cuda_graphs import CudaGraphSteps
from decoder_service.model.decoder import CodecDecoder
from decoder_service.model.random_init import init_random_weights
from decoder_service.model.self_check import start_batcher
from decoder_service.model.streaming import DecoderSession, SessionBatcher
from tests.helpers.decoder import small_config
from tts_common.stage_main import StageModelConfig

EXACT = 1e-5  # float32: different matmul shapes only
BUCKETS = {"batch_buckets": (1, 2, 4), "frame_buckets": (2, 5)}
SHAPES = {(b, f) for b in BUCKETS["batch_buckets"] for f in BUCKETS["frame_buckets"]}


@pytest.fixture(scope="module")
def small() -> CodecDecoder:
    return init_random_weights(CodecDecoder(small_config()), seed=7).eval()


@pytest.fixture(scope="module")
def unbounded(small: CodecDecoder) -> CudaGraphSteps:
    return CudaGraphSteps(small, BUCKETS["batch_buckets"], BUCKETS["frame_buckets"], "emulated")


def _bytes(tensors: object) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(_bytes(v) for v in tensors.values())
    return sum(_bytes(v) for v in tensors)  # type: ignore[attr-defined]


def _captured_shapes(graphs: CudaGraphSteps) -> set[tuple[int, int]]:
    return set(graphs._buckets)


def test_the_emulated_count_is_the_static_inputs_and_outputs(unbounded: CudaGraphSteps) -> None:
    assert unbounded.left_out == () and _captured_shapes(unbounded) == SHAPES
    shared = {id(b.state): b for b in unbounded._buckets.values()}
    inputs = sum(_bytes(b.state) + _bytes(b.positions) for b in shared.values()) + sum(
        _bytes(b.codes) + _bytes(b.lengths) for b in unbounded._buckets.values()
    )
    outputs = sum(_bytes(c.outputs) for c in unbounded.captured.values())
    assert unbounded.static_bytes == inputs
    assert unbounded.held_bytes == inputs + outputs


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 1.2), more=st.floats(0.0, 0.5))
@example(fraction=0.1, more=0.0)
@example(fraction=0.2, more=0.1)
@example(fraction=0.3, more=0.5)
@example(fraction=0.5, more=0.2)
@example(fraction=0.7, more=0.0)
@example(fraction=0.9, more=0.3)
def test_the_bound_holds_keeps_the_small_batches_and_grows_monotonically(
    small: CodecDecoder, unbounded: CudaGraphSteps, fraction: float, more: float
) -> None:
    bound = int(unbounded.held_bytes * fraction)
    graphs = CudaGraphSteps(small, BUCKETS["batch_buckets"], BUCKETS["frame_buckets"], "emulated", bound)
    assert graphs.held_bytes <= bound
    # whole batch sizes, smallest first: a prefix of the batch buckets, every frames bucket of each
    batches = BUCKETS["batch_buckets"]
    assert graphs.batch_buckets + graphs.left_out == batches
    assert _captured_shapes(graphs) == {
        (b, f) for b in graphs.batch_buckets for f in BUCKETS["frame_buckets"]
    }
    assert len(graphs.report.names) == len(graphs.captured) == len(_captured_shapes(graphs))
    if fraction >= 1:
        assert graphs.batch_buckets == batches
    larger = CudaGraphSteps(
        small, BUCKETS["batch_buckets"], BUCKETS["frame_buckets"], "emulated", int(bound * (1 + more))
    )
    assert set(larger.batch_buckets) >= set(graphs.batch_buckets)
    if graphs.left_out:  # the next batch size would not have fitted
        assert larger.held_bytes > bound or larger.batch_buckets == graphs.batch_buckets


def test_zero_bound_captures_nothing_and_runs_eagerly(small: CodecDecoder) -> None:
    batcher = SessionBatcher(small, emulate_cuda_graphs=True, graph_memory=0, **BUCKETS)  # type: ignore[arg-type]
    assert batcher.graphs is None and batcher.batch_buckets == BUCKETS["batch_buckets"]
    codes = torch.randint(0, small.config.codebook_size, (9, small.num_quantizers))
    session = DecoderSession(small)
    out = torch.cat(batcher.advance([session], [codes[:4]]) + batcher.advance([session], [codes[4:]]))
    assert float((out - small.decode(codes)).abs().max()) < EXACT


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 1000), fraction=st.floats(0.2, 0.8))
def test_bounded_streams_equal_the_whole_utterance_decode(
    small: CodecDecoder, unbounded: CudaGraphSteps, data: st.DataObject, seed: int, fraction: float
) -> None:
    """Groups larger than the captured batch sizes split: every stream still equals its
    whole-utterance decode, and only captured steps ran."""
    batcher = SessionBatcher(
        small,
        emulate_cuda_graphs=True,
        graph_memory=int(unbounded.held_bytes * fraction),
        **BUCKETS,  # type: ignore[arg-type]
    )
    graphs = batcher.graphs
    assert graphs is not None and batcher.batch_buckets == graphs.batch_buckets
    replays_before = sum(c.replays for c in graphs.captured.values())
    gen = torch.Generator().manual_seed(seed)
    n_streams = data.draw(st.integers(1, 4), label="streams")
    codes = [
        torch.randint(0, small.config.codebook_size, (24, small.num_quantizers), generator=gen)
        for _ in range(n_streams)
    ]
    sessions = [DecoderSession(small) for _ in range(n_streams)]
    audio: list[list[torch.Tensor]] = [[] for _ in range(n_streams)]
    pos = [0] * n_streams
    for _ in range(data.draw(st.integers(1, 5), label="steps")):
        active = [i for i in range(n_streams) if data.draw(st.booleans(), label="active")] or [0]
        sizes = {i: data.draw(st.integers(0, 6), label="n") for i in active}
        outs = batcher.advance(
            [sessions[i] for i in active], [codes[i][pos[i] : pos[i] + sizes[i]] for i in active]
        )
        for i, out in zip(active, outs):
            audio[i].append(out)
            pos[i] += sizes[i]
    if any(pos):  # every step replayed a graph (larger groups split into captured batch sizes)
        assert sum(c.replays for c in graphs.captured.values()) > replays_before
    for i in range(n_streams):
        if pos[i]:
            whole = small.decode(codes[i][: pos[i]])
            assert float((torch.cat(audio[i]) - whole).abs().max()) < EXACT


def test_self_check_passes_and_checks_the_captured_buckets_only(
    small: CodecDecoder, unbounded: CudaGraphSteps
) -> None:
    bound = unbounded.held_bytes // 2
    batcher, outcome = start_batcher(small, "on", emulate=True, graph_memory=bound, **BUCKETS)
    assert outcome.fallback_reason == "" and batcher.graphs is not None
    assert batcher.graphs.left_out and batcher.graphs.captured
    checked = {tuple(s) for c in outcome.report.checks for s in (c.details or {}).get("buckets", [])}
    assert checked and checked <= _captured_shapes(batcher.graphs)
    assert "left out (run as groups of" in batcher.graphs.describe_bound()


def test_graph_memory_flag() -> None:
    def config(*argv: str) -> DecoderConfig:
        args = FLAGS.parser({}).parse_args(list(argv))
        return decoder_config_from_args(StageModelConfig(), args)

    assert config().graph_memory == DEFAULT_GRAPH_MEMORY == 4 * 2**30
    assert config("--graph-memory", "1536MiB").graph_memory == 1536 * 2**20
    assert config("--graph-memory", "0").graph_memory == 0
    with pytest.raises(SystemExit):
        config("--graph-memory", "0.5")
