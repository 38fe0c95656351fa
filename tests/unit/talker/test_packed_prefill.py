"""Several prompts prefilled in one forward (``TalkerRunner.prefill`` of a group): each request's
K/V, decode state and codes (greedy, and sampled given its seed) are bit-identical to its prompt
prefilled alone, whatever the lengths of the prompts beside it, with the CPU kernels an engine
chooses for float32, bfloat16 and int8; requests arriving together while others run are prefilled
together and get their official codes; the grouping into forwards bounds the padding."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.engine import EngineConfig, TalkerEngine
from talker_service.engine.request import EngineRequest
from talker_service.engine.runner import PADDING_ALLOWANCE, PADDING_SLACK, TalkerRunner, forward_groups
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import TalkerPrompt
from tests.helpers.fixtures import CKPT_DIR, fixture_case, fixture_prompt_inputs, load_requests
from tests.helpers.talker import Collector
from tts_common.kernels.choice import set_up_linears
from tts_common.onednn_linear import onednn_linear_available
from tts_common.synthesis import SamplingParams

NAME = "tiny_custom_voice_1b7"  # a talker wider than its code predictor: every projection runs
MAX_LEN = 96
STEPS = 2


@pytest.fixture(
    scope="module", params=[("float32", "none"), ("bfloat16", "none"), ("float32", "int8")], ids=str
)
def model(request: pytest.FixtureRequest) -> TalkerModel:
    dtype, quantization = request.param
    m = TalkerModel.from_checkpoint(CKPT_DIR / NAME, dtype=getattr(torch, dtype))
    if not onednn_linear_available():
        pytest.skip("torch built without oneDNN")
    set_up_linears(m.talker, m.device, m.dtype, "auto", quantization, (1, 2, 4, 8))
    assert all(type(mod) is not torch.nn.Linear for mod in m.talker.modules())
    return m


def _prompt(model: TalkerModel, length: int, seed: int) -> TalkerPrompt:
    """Codec embeddings of seeded random ids: the model's own scale, distinct per seed."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.talker.cfg.vocab_size - 1024, (length + STEPS + 1,), generator=gen)
    with torch.inference_mode():
        rows = model.talker.codec_embed(ids)
    return TalkerPrompt(prefill=rows[:length], trailing=rows[length:-1], tts_pad=rows[-1], text_tokens=2)


def _sampling(kind: int, seed: int) -> SamplingParams:
    return [
        SamplingParams.greedy(),
        SamplingParams(seed=seed, temperature=0.9, top_k=50, top_p=0.95),
        SamplingParams(seed=seed, subtalker_do_sample=False),
        SamplingParams(seed=seed, do_sample=False, subtalker_do_sample=True),
    ][kind]


def _requests(model: TalkerModel, rows: list[tuple[int, int]], seed: int) -> list[EngineRequest]:
    out = []
    for slot, (length, kind) in enumerate(rows):
        request = EngineRequest(f"r{slot}", None, _sampling(kind, seed + slot), None, lambda e: None)  # type: ignore[arg-type]
        request.prompt = _prompt(model, length, seed + slot)
        request.slot = slot
        request.max_frames = STEPS
        out.append(request)
    return out


def _run(model: TalkerModel, rows: list[tuple[int, int]], seed: int, together: bool):
    """Prefill the rows (together, or each alone in turn) into slots 0..n-1, then decode them
    (one batch) for STEPS steps: per row its slot's K/V prefix, its slot-table row and its frames."""
    config = EngineConfig(max_slots=len(rows), max_seq_len=MAX_LEN)
    runner = TalkerRunner(model.talker, config)
    requests = _requests(model, rows, seed)
    if together:
        runner.prefill(requests)
    else:
        for request in requests:
            runner.prefill([request])
    out = []
    for request, (length, _) in zip(requests, rows):
        slot = request.slot
        kv = (runner.cache.k[:, slot, :, :length].clone(), runner.cache.v[:, slot, :, :length].clone())
        table = runner.table.rows(torch.tensor([slot]))
        state = [
            getattr(table, f.name).clone()
            for f in dataclasses.fields(table)
            if f.name not in ("params", "slots")
        ]
        out.append((kv, state, []))
    for _ in range(STEPS):
        for row, codes in enumerate(runner.step(requests).frame_codes.tolist()):
            out[row][2].append(codes)
        for request in requests:
            request.frames_emitted += 1
    return out


def _assert_together_equals_alone(model: TalkerModel, rows: list[tuple[int, int]], seed: int) -> None:
    together = _run(model, rows, seed, together=True)
    alone = _run(model, rows, seed, together=False)
    for row, ((kv, state, frames), (kv_alone, state_alone, frames_alone)) in enumerate(zip(together, alone)):
        assert all(torch.equal(a, b) for a, b in zip(kv, kv_alone)), f"row {row}: K/V"
        assert all(torch.equal(a, b) for a, b in zip(state, state_alone)), f"row {row}: decode state"
        assert frames == frames_alone, f"row {row}: frames"


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=6),
    seed=st.integers(0, 2**20),
)
def test_a_prompt_prefilled_with_others_equals_it_alone(
    model: TalkerModel, rows: list[tuple[int, int]], seed: int, one_torch_thread: None
) -> None:
    _assert_together_equals_alone(model, rows, seed)


def test_a_prompt_prefilled_with_others_equals_it_alone_on_two_threads(model: TalkerModel) -> None:
    """The same on two threads (the kernels split their work by rows and threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _assert_together_equals_alone(model, [(40, 1), (33, 0), (12, 2), (12, 3), (7, 1), (1, 0)], seed=5)
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=24))
def test_forward_groups_cover_each_prompt_once_and_bound_the_padding(lengths: list[int]) -> None:
    groups = forward_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        real = sum(lengths[i] for i in group)
        padded = len(group) * max(lengths[i] for i in group)
        assert len(group) == 1 or padded <= (1 + PADDING_ALLOWANCE) * real + PADDING_SLACK
        assert [lengths[i] for i in group] == sorted((lengths[i] for i in group), reverse=True)
    assert len(forward_groups([12] * 16)) == 1  # streamed-text prompts: one forward


def test_requests_arriving_together_while_one_runs_are_prefilled_together_with_official_codes() -> None:
    lines = load_requests(NAME)
    sources = [fixture_prompt_inputs(NAME, line) for line in lines]
    m = TalkerModel.from_checkpoint(CKPT_DIR / NAME)
    config = EngineConfig(max_slots=len(lines), max_seq_len=256, max_prefills_per_step=4)
    groups: list[int] = []
    with TalkerEngine(m, config) as engine:
        prefill = engine.runner.prefill

        def counted(requests: list[EngineRequest]) -> None:
            groups.append(len(requests))
            prefill(requests)

        engine.runner.prefill = counted  # type: ignore[method-assign]
        sinks = [Collector() for _ in lines]
        engine.add("r0", sources[0], SamplingParams.greedy(), 80, sinks[0])
        deadline = time.monotonic() + 60
        while len(sinks[0].frames) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        for i in range(1, len(lines)):
            engine.add(f"r{i}", sources[i], SamplingParams.greedy(), 80, sinks[i])
        for sink in sinks:
            sink.wait()
    assert groups[0] == 1 and max(groups[1:]) > 1 and max(groups) <= 4, groups
    for line, sink in zip(lines, sinks):
        case, i = fixture_case(NAME, line)
        expected = np.load(case / f"codes_{i}.npy")
        got = np.array(sink.frames, dtype=np.int64).reshape(-1, expected.shape[1])
        np.testing.assert_array_equal(got, expected, err_msg=line["id"])


def test_a_prompt_that_fails_its_prefill_ends_alone() -> None:
    """A group whose forward fails is prefilled again one request at a time: only the request
    at fault ends with an error, the others get their official codes."""
    lines = load_requests(NAME)[:2]
    m = TalkerModel.from_checkpoint(CKPT_DIR / NAME)
    good = [m.build_prompt(fixture_prompt_inputs(NAME, line)) for line in lines]
    bad = dataclasses.replace(good[0], prefill=torch.zeros(5, m.talker.cfg.hidden_size + 1))
    sinks = [Collector() for _ in range(3)]
    engine = TalkerEngine(m, EngineConfig(max_slots=3, max_seq_len=256))
    for i, prompt in enumerate([good[0], bad, good[1]]):  # queued before the loop runs: one group
        engine.add(f"r{i}", prompt, SamplingParams.greedy(), 80, sinks[i])
    with engine:
        done = [sink.wait() for sink in sinks]
    assert done[1].error is not None and not sinks[1].frames
    for line, sink, event in zip(lines, [sinks[0], sinks[2]], [done[0], done[2]]):
        assert event.error is None
        case, i = fixture_case(NAME, line)
        expected = np.load(case / f"codes_{i}.npy")
        np.testing.assert_array_equal(np.array(sink.frames).reshape(-1, expected.shape[1]), expected)
