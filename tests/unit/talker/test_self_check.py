"""The talker's graph-path self-check (talker_service.engine.self_check): the block lists are
checked against the lengths by an independent computation, a wrong list or a failed capture is
detected, and the engine then falls back to eager and still gives the official greedy codes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.engine import EngineConfig, TalkerEngine
from talker_service.engine.self_check import edge_lengths, expected_blocks, verify_block_lists
from talker_service.model import TalkerModel
from talker_service.model.decode_attention import KV_BLOCK, InPlaceAttention
from tests.helpers.fixtures import fixture_prompt_inputs, load_requests
from tests.helpers.talker import wrong_partial_index
from tts_common import metrics
from tts_common.cuda_graphs import StepCapture
from tts_common.self_check import CheckFailedError, GraphPathError
from tts_common.synthesis import SamplingParams

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NAME = "tiny_custom_voice_1b7"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TalkerModel:
    return TalkerModel.from_checkpoint(FIXTURES / "ckpt" / NAME)


@settings(max_examples=40, deadline=None)
@given(
    max_len=st.integers(1, 5 * KV_BLOCK + 3),
    data=st.data(),
)
def test_correct_block_lists_pass_for_any_lengths(max_len: int, data: st.DataObject) -> None:
    lengths = data.draw(st.lists(st.integers(1, max_len), min_size=1, max_size=5))
    attention = InPlaceAttention(len(lengths), max_len, torch.device("cpu"), "flex")
    verify_block_lists(attention, lengths)
    for length in lengths:  # the independent expectation: the lists partition [0, length)
        full, partial = expected_blocks(length, -(-max_len // KV_BLOCK))
        covered = sum(KV_BLOCK for _ in full) + sum(length - j * KV_BLOCK for j in partial)
        assert covered == length and not full & partial


def test_edge_lengths_cover_the_block_edges() -> None:
    assert edge_lengths(300) == [1, 127, 128, 129, 256, 299, 300]
    assert edge_lengths(2) == [1, 2]


@pytest.mark.parametrize("length", [127, 129, 200])
def test_a_wrong_partial_index_is_detected(monkeypatch: pytest.MonkeyPatch, length: int) -> None:
    wrong_partial_index(monkeypatch)
    attention = InPlaceAttention(2, 3 * KV_BLOCK, torch.device("cpu"), "flex")
    with pytest.raises(CheckFailedError, match="partial-block list of row 0"):
        verify_block_lists(attention, [length, 1])


def _config(**kw: object) -> EngineConfig:
    return EngineConfig(max_slots=3, max_seq_len=256, emulate_cuda_graphs=True, **kw)  # type: ignore[arg-type]


def test_the_graph_path_passes_its_startup_checks(model: TalkerModel) -> None:
    engine = TalkerEngine(model, _config())
    report = engine.graph_check.report
    assert report.passed, report.describe_failure()
    names = [c.name for c in report.checks]
    assert names == ["talker.capture", "talker.block_lists", "talker.attention", "talker.graph_vs_eager"]
    assert engine.runner.graphs is not None and engine.graph_check.fallback_reason == ""


def _official_codes_after_fallback(model: TalkerModel, engine: TalkerEngine) -> None:
    ref = FIXTURES / "reference" / NAME
    lines = load_requests(NAME)[:2]
    with engine:
        got = engine.generate_all(
            [(fixture_prompt_inputs(NAME, line), SamplingParams.greedy(1.05), 80) for line in lines]
        )
    for line, generation in zip(lines, got):
        want = np.load(ref / line["expect"]["codes"])
        np.testing.assert_array_equal(generation.codes, want, err_msg=line["id"])


def _failures(check: str) -> float:
    return metrics.SELF_CHECK_FAILURES.labels(stage="talker", check=check)._value.get()


def test_a_wrong_block_list_falls_back_to_eager_with_the_official_codes(
    model: TalkerModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong_partial_index(monkeypatch)
    before = _failures("talker.block_lists")
    engine = TalkerEngine(model, _config())
    assert engine.runner.graphs is None
    assert "talker.block_lists" in engine.graph_check.fallback_reason
    assert "partial-block list" in engine.graph_check.fallback_reason
    assert _failures("talker.block_lists") == before + 1
    _official_codes_after_fallback(model, engine)


def test_a_compile_failure_falls_back_to_eager_with_the_official_codes(
    model: TalkerModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: StepCapture, name: str, step: object) -> None:
        raise RuntimeError("InductorError: no C compiler found")

    monkeypatch.setattr(StepCapture, "capture", fail)
    engine = TalkerEngine(model, _config())
    assert engine.runner.graphs is None
    assert engine.graph_check.fallback_reason.startswith("self-check failed, eager fallback: talker.capture:")
    assert "no C compiler" in engine.graph_check.fallback_reason
    _official_codes_after_fallback(model, engine)


def test_cuda_graphs_on_fails_instead_of_falling_back(
    model: TalkerModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong_partial_index(monkeypatch)
    with pytest.raises(GraphPathError, match="talker.block_lists"):
        TalkerEngine(model, _config(cuda_graphs="on"))


def test_cuda_graphs_on_needs_a_gpu(model: TalkerModel) -> None:
    with pytest.raises(ValueError, match="needs a cuda device"):
        TalkerEngine(model, EngineConfig(max_slots=2, max_seq_len=128, cuda_graphs="on"))


def test_the_model_info_names_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from talker_service.server import TalkerServicer

    wrong_partial_index(monkeypatch)
    servicer = TalkerServicer(str(FIXTURES / "ckpt" / NAME), _config())
    asyncio.run(servicer.load())
    try:
        assert servicer.info is not None
        assert servicer.info.step_path == "eager (fallback)"
        assert "talker.block_lists" in servicer.info.fallback_reason
        assert metrics.GRAPH_PATH.labels(stage="talker")._value.get() == 0
    finally:
        asyncio.run(servicer.close())


def test_the_cuda_reference_runs_the_same_steps_eagerly(model: TalkerModel) -> None:
    """What the check compares real CUDA graphs with (the bucket's step run on its buffers
    without replaying), exercised on the emulation: it must give the replayed codes."""
    from talker_service.engine.runner import TalkerRunner
    from talker_service.engine.self_check import run_rows, verify_graph_vs_eager

    runner = TalkerRunner(model.talker, _config())
    graphs = runner.graphs
    assert graphs is not None
    replayed = run_rows(runner, model.talker, 3, 3)
    graphs.replay = False
    try:
        assert run_rows(runner, model.talker, 3, 3) == replayed
    finally:
        graphs.replay = True
    graphs.report.mode = "cuda"  # the CUDA branch of the check, on the emulated graphs
    verify_graph_vs_eager(runner, graphs, model.talker, 3, 3)
    assert graphs.replay
