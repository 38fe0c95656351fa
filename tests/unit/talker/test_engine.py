"""The continuous-batching talker engine: batch == alone, staggered arrivals, seeds, cancellation,
admission (prompt built once, on the engine thread; refusals delivered as the request's error),
and the scheduler's add / schedule / update contract."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from talker_service.engine import EngineConfig, FinishReason, FrameEvent, TalkerEngine
from talker_service.engine.request import EngineRequest
from talker_service.engine.scheduler import Scheduler
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import PromptInputs
from tests.helpers.fixtures import (
    CHECKPOINT_NAMES,
    CKPT_DIR,
    fixture_case,
    fixture_prompt_inputs,
    load_requests,
)
from tests.helpers.talker import Collector
from tts_common.errors import CapacityError, InvalidRequestError, UnavailableError
from tts_common.synthesis import RunawayGuard, SamplingParams

MAX_NEW_TOKENS = 80  # the fixtures' setting: at most 79 frames


@pytest.fixture(scope="module")
def models() -> dict[str, TalkerModel]:
    return {name: TalkerModel.from_checkpoint(CKPT_DIR / name) for name in CHECKPOINT_NAMES}


def _run_staggered(engine, sources, sampling, stagger_frames: int = 3, max_new_tokens: int = MAX_NEW_TOKENS):
    """Add requests one after another, each once the previous has produced a few frames."""
    sinks = []
    for source, params in zip(sources, sampling):
        if sinks:
            prev = sinks[-1]
            deadline = time.monotonic() + 60
            while len(prev.frames) < stagger_frames and prev.done is None and time.monotonic() < deadline:
                time.sleep(0.001)
        sink = Collector()
        engine.add(f"r{len(sinks)}", source, params, max_new_tokens, sink)
        sinks.append(sink)
    for sink in sinks:
        assert sink.event.wait(120), "request did not finish"
    return sinks


def _first_inputs(name: str = "tiny_voice_design") -> PromptInputs:
    return fixture_prompt_inputs(name, load_requests(name)[0])


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_batched_staggered_greedy_matches_reference(models, name):
    model = models[name]
    lines = load_requests(name)
    sources = [fixture_prompt_inputs(name, line) for line in lines]
    with TalkerEngine(model, EngineConfig(max_slots=len(lines), max_seq_len=256)) as engine:
        sinks = _run_staggered(engine, sources, [SamplingParams.greedy()] * len(sources))
        assert engine.stats().running == 0
        assert engine.stats().last_batch_size >= 1
    for line, sink in zip(lines, sinks):
        case, i = fixture_case(name, line)
        expected = np.load(case / f"codes_{i}.npy")
        got = np.array(sink.frames, dtype=np.int64).reshape(-1, expected.shape[1])
        assert sink.done is not None and sink.done.reason in (FinishReason.EOS, FinishReason.LENGTH)
        np.testing.assert_array_equal(got, expected, err_msg=f"{name}/{line['id']}")


def test_seeded_sampling_alone_equals_batched(models):
    name = "tiny_custom_voice_1b7"
    model = models[name]
    sources = [fixture_prompt_inputs(name, line) for line in load_requests(name)[:4]]
    params = [
        SamplingParams(seed=100 + i, temperature=0.9, top_k=50, top_p=0.95) for i in range(len(sources))
    ]
    params[1] = SamplingParams.greedy()  # sampled and greedy rows share the batch
    with TalkerEngine(model, EngineConfig(max_slots=4, max_seq_len=256)) as engine:
        alone = []
        for source, p in zip(sources, params):
            sink = Collector()
            engine.add("alone", source, p, 31, sink)
            assert sink.event.wait(60)
            alone.append(sink.frames)
        batched = _run_staggered(engine, sources, params, stagger_frames=2, max_new_tokens=31)
    for a, b in zip(alone, batched):
        assert len(a) == 30 and a == b.frames
    assert alone[0] != alone[2] or alone[0] != alone[3]  # different seeds differ


def test_cancellation_frees_slot_within_one_step(models):
    with TalkerEngine(models["tiny_voice_design"], EngineConfig(max_slots=2, max_seq_len=512)) as engine:
        sink = Collector()
        request = engine.add("c", _first_inputs(), SamplingParams(seed=1), 401, sink)
        while len(sink.frames) < 3:
            time.sleep(0.001)
        steps_at_cancel = engine.steps
        engine.cancel(request)
        assert sink.event.wait(10)
        assert sink.done.reason is FinishReason.CANCELLED
        assert engine.steps - steps_at_cancel <= 1
        assert len(sink.frames) <= 3 + 1
        assert engine.stats().running == 0


def test_async_generate_closing_iterator_cancels(models):
    engine = TalkerEngine(models["tiny_voice_design"], EngineConfig(max_slots=2, max_seq_len=512))

    async def consume() -> int:
        n = 0
        agen = engine.generate("a", _first_inputs(), SamplingParams(seed=3), 401)
        async for event in agen:
            assert isinstance(event, FrameEvent)
            n += 1
            if n == 2:
                break
        await agen.aclose()
        return n

    with engine:
        assert asyncio.run(consume()) == 2
        deadline = time.monotonic() + 5
        while engine.stats().running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.stats().running == 0


def test_admission_refusals_are_the_requests_errors(models):
    """A full queue is refused at once; a prompt that cannot be built or a budget that cannot fit
    a slot ends the request with its error (before any frame)."""
    model = models["tiny_voice_design"]
    engine = TalkerEngine(model, EngineConfig(max_slots=1, max_waiting=1, max_seq_len=64))
    engine.add("a", _first_inputs(), SamplingParams.greedy(), 10, Collector())  # not started: stays queued
    with pytest.raises(CapacityError, match="queue is full"):
        engine.add("b", _first_inputs(), SamplingParams.greedy(), 10, Collector())
    engine.stop()
    with TalkerEngine(model, EngineConfig(max_slots=1, max_seq_len=64)) as engine:
        big, empty = Collector(), Collector()
        engine.add("big", _first_inputs(), SamplingParams.greedy(), 1000, big)
        engine.add(
            "empty", PromptInputs(text="", non_streaming_text=True), SamplingParams.greedy(), 10, empty
        )
        assert big.event.wait(30) and empty.event.wait(30)
    assert big.frames == [] and big.done.reason is FinishReason.ERROR
    assert isinstance(big.done.error, CapacityError) and "KV positions" in str(big.done.error)
    assert empty.frames == [] and isinstance(empty.done.error, InvalidRequestError)
    with pytest.raises(UnavailableError):
        engine.add("late", _first_inputs(), SamplingParams.greedy(), 10, Collector())


def test_default_budget_is_runaway_guard(models):
    cfg = EngineConfig(
        max_slots=1, max_seq_len=512, runaway_guard=RunawayGuard(base_frames=3, frames_per_text_token=0)
    )
    with TalkerEngine(models["tiny_voice_design"], cfg) as engine:
        sink = Collector()
        engine.add("g", _first_inputs(), SamplingParams(seed=0), None, sink)
        assert sink.event.wait(30)
    assert len(sink.frames) <= 3


def test_prompts_are_built_once_on_the_engine_thread(models, monkeypatch):
    model = models["tiny_voice_design"]
    built_on: list[threading.Thread] = []
    original = TalkerModel.build_prompt

    def recording(self, request):
        built_on.append(threading.current_thread())
        return original(self, request)

    monkeypatch.setattr(TalkerModel, "build_prompt", recording)
    with TalkerEngine(model, EngineConfig(max_slots=2, max_seq_len=256)) as engine:
        sinks = _run_staggered(engine, [_first_inputs()] * 2, [SamplingParams(seed=1)] * 2, max_new_tokens=6)
        loop_thread = engine._thread
    assert built_on == [loop_thread, loop_thread]
    assert all(s.done.prompt_len > 0 for s in sinks)


class _Prompt:  # the parts of a TalkerPrompt the scheduler reads
    def __init__(self, prefill_len: int, trailing_len: int = 1) -> None:
        self.prefill = torch.zeros(prefill_len, 4)
        self.trailing = torch.zeros(trailing_len, 4)

    @property
    def prefill_len(self) -> int:
        return self.prefill.shape[0]


def _request(rid: str, prefill_len: int, max_frames: int = 10, trailing_len: int = 1, **kw) -> EngineRequest:
    prompt = _Prompt(prefill_len, trailing_len)
    request = EngineRequest(rid, prompt, SamplingParams.greedy(), None, lambda e: None, **kw)  # type: ignore[arg-type]
    request.prompt, request.max_frames = prompt, max_frames  # type: ignore[assignment]
    return request


def test_scheduler_bounds_prefill_work_per_step_and_drops_cancelled():
    sched = Scheduler(EngineConfig(max_slots=8, max_prefill_tokens_per_step=100, max_seq_len=1000))
    reqs = [_request(f"r{i}", 60) for i in range(4)]
    for r in reqs:
        sched.add(r)
    assert [r.request_id for r in sched.schedule().prefill] == ["r0"]  # 60 + 60 > 100
    out = sched.schedule()
    assert [r.request_id for r in out.prefill] == ["r1"]
    assert [r.request_id for r in out.decode] == ["r0", "r1"]  # the newcomer decodes in its first step
    reqs[2].cancelled.set()
    out = sched.schedule()
    assert out.aborted == [reqs[2]] and [r.request_id for r in out.prefill] == ["r3"]
    assert sched.num_running == 3 and sched.num_waiting == 0
    assert [r.slot for r in (reqs[0], reqs[1], reqs[3])] == [0, 1, 2]  # lowest free slot first


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    running=st.integers(0, 4),
    per_step=st.integers(1, 4),
)
def test_admissions_per_step_are_bounded_while_streams_run(arrivals: list[int], running: int, per_step: int):
    """While any stream runs, at most max_prefills_per_step prefills land between two of its steps
    (and the token bound holds); an idle engine admits up to the token bound; everyone gets in."""
    config = EngineConfig(
        max_slots=64, max_seq_len=100, max_prefill_tokens_per_step=64, max_prefills_per_step=per_step
    )
    sched = Scheduler(config)
    for i in range(running):
        sched.add(_request(f"run{i}", 5, max_frames=90))
    sched.schedule()  # idle: the running ones get in at once (within the token bound)
    while sched.num_waiting:
        sched.schedule()
    for i, length in enumerate(arrivals):
        sched.add(_request(f"new{i}", length, max_frames=50))
    admitted = 0
    while sched.num_waiting:
        streams = sched.num_running > 0
        out = sched.schedule()
        assert out.prefill, "no progress"
        if streams:
            assert len(out.prefill) <= per_step
        assert len(out.prefill) == 1 or sum(r.prompt_len for r in out.prefill) <= 64
        admitted += len(out.prefill)
    assert admitted == len(arrivals)


def test_scheduler_update_retires_on_eos_and_budget_and_frees_the_slot():
    sched = Scheduler(EngineConfig(max_slots=2, max_seq_len=100))
    short, long = _request("short", 5, max_frames=2), _request("long", 5, max_frames=50)
    sched.add(short)
    sched.add(long)
    out = sched.schedule()
    assert sched.update(out.decode, [False, False]) == []
    assert sched.update(out.decode, [False, False]) == [(short, FinishReason.LENGTH)]
    assert short.frames_emitted == 2 and short.slot is None and sched.num_running == 1
    assert sched.update(sched.schedule().decode, [True]) == [(long, FinishReason.EOS)]
    assert sched.num_running == 0


def test_scheduler_refuses_what_can_never_fit():
    sched = Scheduler(EngineConfig(max_slots=1, max_seq_len=64))
    with pytest.raises(CapacityError, match="needs 75 KV positions"):
        sched.add(_request("big", 10, max_frames=64))
    with pytest.raises(CapacityError, match="leaves no room"):
        sched.add(_request("long prompt", 63, max_frames=1))
    sched.add(_request("fits", 10, max_frames=53))


def test_waiting_for_text_does_not_hold_back_others():
    sched = Scheduler(EngineConfig(max_slots=4))
    streaming = _request("s", 5, trailing_len=2, text_complete=False)
    other = _request("o", 5)
    sched.add(streaming)
    sched.add(other)
    sched.schedule()
    streaming.frames_emitted = 2  # consumed both trailing rows, more text not yet arrived
    assert sched.schedule().decode == [other]
