"""The continuous-batching talker engine: batch == alone, staggered arrivals, seeds, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from talker_service.engine import DoneEvent, EngineConfig, FinishReason, FrameEvent, TalkerEngine
from talker_service.engine.scheduler import Scheduler
from talker_service.model.loader import TalkerModel
from talker_service.model.sampling import SamplingParams
from tests.helpers.fixtures import (
    CHECKPOINT_NAMES,
    CKPT_DIR,
    fixture_case,
    fixture_synthesis_request,
    load_requests,
)
from tts_common.errors import CapacityError, UnavailableError

MAX_NEW_TOKENS = 80  # the fixtures' setting: at most 79 frames


@pytest.fixture(scope="module")
def models() -> dict[str, TalkerModel]:
    return {name: TalkerModel.from_checkpoint(CKPT_DIR / name) for name in CHECKPOINT_NAMES}


class Collector:
    """Thread-safe sink gathering one request's events."""

    def __init__(self) -> None:
        self.frames: list[list[int]] = []
        self.done: DoneEvent | None = None
        self.event = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, FrameEvent):
            assert event.index == len(self.frames)
            self.frames.append(event.codes)
        else:
            self.done = event
            self.event.set()


def _run_staggered(
    engine: TalkerEngine, prompts, sampling, stagger_frames: int = 3, max_frames: int = MAX_NEW_TOKENS - 1
):
    """Submit prompts one after another, each once the previous has produced a few frames."""
    sinks = []
    for prompt, params in zip(prompts, sampling):
        if sinks:
            prev = sinks[-1]
            deadline = time.monotonic() + 60
            while len(prev.frames) < stagger_frames and prev.done is None and time.monotonic() < deadline:
                time.sleep(0.001)
        sink = Collector()
        engine.submit(f"r{len(sinks)}", prompt, params, max_frames, sink)
        sinks.append(sink)
    for sink in sinks:
        assert sink.event.wait(120), "request did not finish"
    return sinks


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_batched_staggered_greedy_matches_reference(models, name):
    model = models[name]
    lines = load_requests(name)
    prompts = [model.build_prompt(fixture_synthesis_request(name, line)) for line in lines]
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=len(lines), max_seq_len=256))
    engine.start()
    try:
        sinks = _run_staggered(engine, prompts, [SamplingParams.greedy()] * len(prompts))
        assert engine.stats().running == 0
        assert max(engine.stats().last_batch_size, 0) >= 1
    finally:
        engine.stop()
    for line, sink in zip(lines, sinks):
        case, i = fixture_case(name, line)
        expected = np.load(case / f"codes_{i}.npy")
        got = np.array(sink.frames, dtype=np.int64).reshape(-1, expected.shape[1])
        assert sink.done is not None and sink.done.reason in (FinishReason.EOS, FinishReason.LENGTH)
        np.testing.assert_array_equal(got, expected, err_msg=f"{name}/{line['id']}")


def test_seeded_sampling_alone_equals_batched(models):
    name = "tiny_custom_voice_1b7"
    model = models[name]
    lines = load_requests(name)[:4]
    prompts = [model.build_prompt(fixture_synthesis_request(name, line)) for line in lines]
    params = [
        SamplingParams(seed=100 + i, temperature=0.9, top_k=50, top_p=0.95) for i in range(len(prompts))
    ]
    # Mix in a greedy request: sampled and greedy rows share the batch.
    params[1] = SamplingParams.greedy()
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=4, max_seq_len=256))
    engine.start()
    try:
        alone = []
        for prompt, p in zip(prompts, params):
            sink = Collector()
            engine.submit("alone", prompt, p, 30, sink)
            assert sink.event.wait(60)
            alone.append(sink.frames)
        batched = _run_staggered(engine, prompts, params, stagger_frames=2, max_frames=30)
    finally:
        engine.stop()
    for a, b in zip(alone, batched):
        assert a == b.frames
    assert alone[0] != alone[2] or alone[0] != alone[3]  # different seeds differ


def test_cancellation_frees_slot_within_one_step(models):
    model = models["tiny_voice_design"]
    line = load_requests("tiny_voice_design")[0]
    prompt = model.build_prompt(fixture_synthesis_request("tiny_voice_design", line))
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=2, max_seq_len=512))
    engine.start()
    try:
        sink = Collector()
        request = engine.submit("c", prompt, SamplingParams(seed=1), 400, sink)
        while len(sink.frames) < 3:
            time.sleep(0.001)
        steps_at_cancel = engine.steps
        engine.cancel(request)
        assert sink.event.wait(10)
        assert sink.done.reason is FinishReason.CANCELLED
        assert engine.steps - steps_at_cancel <= 1
        assert len(sink.frames) <= 3 + 1
        assert engine.stats().running == 0
    finally:
        engine.stop()


def test_async_generate_closing_iterator_cancels(models):
    model = models["tiny_voice_design"]
    line = load_requests("tiny_voice_design")[0]
    prompt = model.build_prompt(fixture_synthesis_request("tiny_voice_design", line))
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=2, max_seq_len=512))
    engine.start()

    async def consume() -> int:
        n = 0
        agen = engine.generate("a", prompt, SamplingParams(seed=3), 400)
        async for event in agen:
            assert isinstance(event, FrameEvent)
            n += 1
            if n == 2:
                break
        await agen.aclose()
        return n

    try:
        assert asyncio.run(consume()) == 2
        deadline = time.monotonic() + 5
        while engine.stats().running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert engine.stats().running == 0
    finally:
        engine.stop()


def test_capacity_errors(models):
    model = models["tiny_voice_design"]
    line = load_requests("tiny_voice_design")[0]
    prompt = model.build_prompt(fixture_synthesis_request("tiny_voice_design", line))
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=1, max_waiting=1, max_seq_len=64))
    # Not started: nothing is consumed, so the queue fills.
    with pytest.raises(CapacityError, match="KV positions"):
        engine.submit("big", prompt, SamplingParams.greedy(), 1000, Collector())
    engine.submit("a", prompt, SamplingParams.greedy(), 10, Collector())
    with pytest.raises(CapacityError, match="queue is full"):
        engine.submit("b", prompt, SamplingParams.greedy(), 10, Collector())


def test_default_budget_is_runaway_guard(models):
    model = models["tiny_voice_design"]
    line = load_requests("tiny_voice_design")[0]
    prompt = model.build_prompt(fixture_synthesis_request("tiny_voice_design", line))
    cfg = EngineConfig(
        max_slots=1, max_seq_len=512, default_budget_base_frames=3, default_budget_frames_per_token=0
    )
    engine = TalkerEngine(model.talker, cfg)
    engine.start()
    try:
        sink = Collector()
        engine.submit("g", prompt, SamplingParams(seed=0), None, sink)
        assert sink.event.wait(30)
        assert len(sink.frames) <= 3
    finally:
        engine.stop()


def test_scheduler_bounds_prefill_work_per_iteration():
    from talker_service.engine.request import EngineRequest

    class P:  # minimal prompt stand-in
        def __init__(self, n):
            self.prefill = torch.zeros(n, 4)
            self.trailing = torch.zeros(1, 4)

    cfg = EngineConfig(max_slots=8, max_prefill_tokens_per_step=100, max_seq_len=1000)
    sched = Scheduler(cfg)
    reqs = [EngineRequest(f"r{i}", P(60), SamplingParams.greedy(), 10, lambda e: None) for i in range(4)]
    for r in reqs:
        sched.add(r)
    assert [r.request_id for r in sched.admit()] == ["r0"]  # 60 + 60 > 100
    assert [r.request_id for r in sched.admit()] == ["r1"]
    reqs[2].cancelled.set()
    assert sched.drop_cancelled() == [reqs[2]]
    assert [r.request_id for r in sched.admit()] == ["r3"]
    assert sched.num_running == 3 and sched.num_waiting == 0


def test_waiting_for_text_does_not_hold_back_others():
    from talker_service.engine.request import EngineRequest

    class P:
        def __init__(self, t):
            self.prefill = torch.zeros(5, 4)
            self.trailing = torch.zeros(t, 4)

    sched = Scheduler(EngineConfig(max_slots=4))
    streaming = EngineRequest("s", P(2), SamplingParams.greedy(), 10, lambda e: None, text_complete=False)
    other = EngineRequest("o", P(1), SamplingParams.greedy(), 10, lambda e: None)
    sched.add(streaming)
    sched.add(other)
    sched.admit()
    streaming.frames_emitted = 2  # consumed both trailing rows, more text not yet arrived
    assert sched.decodable() == [other]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_cuda_graph_step_matches_eager(models):
    name = "tiny_custom_voice"
    lines = load_requests(name)
    outputs = {}
    for graphs in (False, True):
        model = TalkerModel.from_checkpoint(CKPT_DIR / name, device="cuda")
        prompts = [model.build_prompt(fixture_synthesis_request(name, line)) for line in lines]
        engine = TalkerEngine(
            model.talker, EngineConfig(max_slots=8, max_seq_len=256, use_cuda_graphs=graphs, device="cuda")
        )
        engine.start()
        try:
            outputs[graphs] = [
                s.frames for s in _run_staggered(engine, prompts, [SamplingParams.greedy()] * len(prompts))
            ]
        finally:
            engine.stop()
    assert outputs[True] == outputs[False]


def test_call_runs_on_the_loop_thread_between_steps(models):
    """Other torch work of the process (prompt building) runs on the engine's own thread."""
    model = models["tiny_voice_design"]
    line = load_requests("tiny_voice_design")[0]
    request = fixture_synthesis_request("tiny_voice_design", line)
    engine = TalkerEngine(model.talker, EngineConfig(max_slots=2, max_seq_len=512))
    engine.start()
    try:
        sink = Collector()
        engine.submit("busy", model.build_prompt(request), SamplingParams(seed=1), 30, sink)
        assert engine.call(threading.current_thread).result(30) is engine._thread
        prompt = engine.call(model.build_prompt, request).result(30)
        torch.testing.assert_close(prompt.prefill, model.build_prompt(request).prefill, rtol=0, atol=0)
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda: 1 / 0).result(30)

        async def awaited() -> int:
            return await engine.run(len, [1, 2, 3])

        assert asyncio.run(awaited()) == 3
        assert sink.event.wait(60) and sink.done.reason is FinishReason.LENGTH
    finally:
        engine.stop()
    with pytest.raises(UnavailableError):
        engine.call(len, [])
