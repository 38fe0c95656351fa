"""The decode step's graph path on CPU (``EngineConfig.emulate_cuda_graphs``): every bucket
captured at startup, compact slots, in-place attention with per-row lengths, batched noise —
against the eager path (codes identical, greedy and sampled rows, bucket switches, slot moves),
and proof that the graph-path step gathers no KV slot."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from talker_service.engine import EngineConfig
from talker_service.engine.request import EngineRequest
from talker_service.engine.runner import TalkerRunner
from talker_service.engine.scheduler import Scheduler
from talker_service.model.decode_attention import InPlaceAttention
from talker_service.model.loader import TalkerModel
from talker_service.model.sampling import RequestNoise
from talker_service.model.step import decode_step
from talker_service.server import TalkerServicer
from tests.helpers.fixtures import CKPT_DIR, fixture_prompt_inputs, load_requests
from tts_common.synthesis import SamplingParams

NAME = "tiny_custom_voice_1b7"


@pytest.fixture(scope="module")
def model() -> TalkerModel:
    return TalkerModel.from_checkpoint(CKPT_DIR / NAME)


@dataclass
class _Run:
    codes: dict[str, list[list[int]]] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=list)
    moves: int = 0


def _drive(model: TalkerModel, config: EngineConfig, plan: list[tuple[int, SamplingParams, int]]) -> _Run:
    """The engine loop, synchronously: request i (sampling, frame budget) arrives at step
    ``plan[i][0]``; returns every request's frames, the buckets used and the slot moves."""
    runner = TalkerRunner(model.talker, config)
    run = _Run()

    def on_move(request: EngineRequest, src: int, dst: int) -> None:
        run.moves += 1
        runner.move_slot(request, src, dst)

    scheduler = Scheduler(config, on_move=on_move)
    lines = load_requests(NAME)
    pending = list(enumerate(plan))
    step = 0
    while pending or scheduler.num_running or scheduler.num_waiting:
        for i, (arrival, sampling, frames) in [p for p in pending if p[1][0] <= step]:
            request = EngineRequest(f"r{i}", None, sampling, None, lambda e: None)  # type: ignore[arg-type]
            request.prompt = model.build_prompt(fixture_prompt_inputs(NAME, lines[i % len(lines)]))
            request.max_frames = frames
            run.codes[request.request_id] = []
            scheduler.add(request)
            pending.remove((i, (arrival, sampling, frames)))
        out = scheduler.schedule()
        if out.prefill:
            runner.prefill(out.prefill)
        if out.decode:
            if runner.graphs is not None:
                run.buckets.append(config.bucket_for(max(r.slot for r in out.decode) + 1))  # type: ignore[type-var]
            result = runner.step(out.decode)
            for request, codes in zip(out.decode, result.frame_codes.tolist()):
                run.codes[request.request_id].append(codes)
            scheduler.update(out.decode, result.is_eos.tolist())
        step += 1
    return run


def _config(emulate: bool, **kw: object) -> EngineConfig:
    return EngineConfig(max_seq_len=96, emulate_cuda_graphs=emulate, noise_steps_per_draw=3, **kw)  # type: ignore[arg-type]


def test_graph_path_equals_eager_with_sampled_rows_bucket_switches_and_moves(model: TalkerModel) -> None:
    sampled = SamplingParams(seed=7, temperature=0.9, top_k=50, top_p=0.95)
    cp_only = SamplingParams(seed=8, do_sample=False, subtalker_do_sample=True)
    talker_only = SamplingParams(seed=9, subtalker_do_sample=False)
    plan = [
        (0, sampled, 7),
        (0, SamplingParams.greedy(), 2),  # finishes early: the request above it moves down
        (1, talker_only, 5),
        (2, cp_only, 9),
        (3, SamplingParams(seed=10), 3),  # waits for a slot (3 slots), then runs in a small batch
    ]
    config: dict[str, object] = {"max_slots": 3, "batch_buckets": (1, 2)}
    eager = _drive(model, _config(False, **config), plan)
    graph = _drive(model, _config(True, **config), plan)
    assert graph.codes == eager.codes
    assert all(0 < len(graph.codes[f"r{i}"]) <= f for i, (_, _, f) in enumerate(plan))
    assert graph.moves >= 1 and graph.moves == eager.moves
    used = set(graph.buckets)
    assert {1, 2, 3} <= used, used  # grew and shrank through every bucket
    switches = sum(a != b for a, b in zip(graph.buckets, graph.buckets[1:]))
    assert switches >= 3
    assert graph.codes["r0"][:3] != graph.codes["r4"][:3]  # different seeds, same text: sampled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["flex", "sdpa"])
def test_cuda_graphs_replay_what_the_emulation_computes(kernel: str) -> None:
    """Real CUDA graphs against their eager emulation on the same GPU: same buckets, padding,
    kernels and static shapes, so the codes must match exactly (sampled rows included)."""
    model = TalkerModel.from_checkpoint(CKPT_DIR / NAME, device="cuda")
    plan = [
        (0, SamplingParams(seed=7, temperature=0.9, top_k=50, top_p=0.95), 7),
        (0, SamplingParams.greedy(), 2),
        (1, SamplingParams(seed=9, subtalker_do_sample=False), 5),
        (2, SamplingParams(seed=8, do_sample=False, subtalker_do_sample=True), 9),
        (3, SamplingParams(seed=10), 3),
    ]
    config = {"max_slots": 3, "batch_buckets": (1, 2), "in_place_attention": kernel, "device": "cuda"}
    emulated = _drive(model, _config(True, **config), plan)
    graphed = _drive(model, _config(False, **config), plan)
    assert graphed.codes == emulated.codes


def test_greedy_only_batches_replay_the_greedy_variant_with_the_eager_codes(model: TalkerModel) -> None:
    greedy = SamplingParams.greedy()
    plan = [(0, greedy, 6), (0, greedy, 3), (1, greedy, 5)]
    config: dict[str, object] = {"max_slots": 3, "batch_buckets": (1, 2)}
    eager = _drive(model, _config(False, **config), plan)
    runner_replays: dict[str, int] = {}
    original = TalkerRunner.step

    def counting(self: TalkerRunner, requests: list[EngineRequest]):  # type: ignore[no-untyped-def]
        out = original(self, requests)
        assert self.graphs is not None
        runner_replays.update({k: c.replays for k, c in self.graphs.captured.items()})
        return out

    TalkerRunner.step = counting  # type: ignore[method-assign]
    try:
        graph = _drive(model, _config(True, **config), plan)
    finally:
        TalkerRunner.step = original  # type: ignore[method-assign]
    assert graph.codes == eager.codes
    assert sum(n for k, n in runner_replays.items() if k.endswith(",greedy]")) > 0
    assert sum(n for k, n in runner_replays.items() if not k.endswith(",greedy]")) == 0


def test_every_bucket_is_captured_before_serving(tmp_path) -> None:
    config = _config(True, max_slots=5, batch_buckets=(1, 2, 4, 8))
    servicer = TalkerServicer(str(CKPT_DIR / NAME), config)
    asyncio.run(servicer.load())  # what serve() awaits before mark_ready() (health SERVING)
    try:
        assert servicer.engine is not None
        graphs = servicer.engine.runner.graphs
        assert graphs is not None
        assert graphs.report.names == [
            f"talker[B={b}{variant}]" for b in (5, 4, 2, 1) for variant in ("", ",greedy")
        ]
        assert set(graphs.captured) == set(graphs.report.names)
    finally:
        asyncio.run(servicer.close())


def test_bucket_for_covers_the_slots() -> None:
    config = EngineConfig(max_slots=6, batch_buckets=(1, 2, 4, 8, 16))
    assert config.graph_buckets == (1, 2, 4, 6)
    assert [config.bucket_for(n) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    with pytest.raises(ValueError):
        config.bucket_for(7)


# --- no KV gather --------------------------------------------------------------------------------

_GATHERS = {"index.Tensor", "index_select.default", "gather.default", "take.default", "_unsafe_index.Tensor"}


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except NotImplementedError:  # oneDNN's packed weights have no storage (and are not KV)
        return None


class _KVReads(TorchDispatchMode):
    """Records index/gather ops that read the KV cache's storage, and every freshly allocated
    tensor shaped like keys of a whole slot ([..., max_len, head_dim]: a copy of slots, such as
    a gather by slot or the math-attention fallback repeating K/V to every query head)."""

    def __init__(self, kv: torch.Tensor) -> None:
        super().__init__()
        self.storage = kv.untyped_storage().data_ptr()
        self.slot_shape = tuple(kv.shape[-2:])
        self.gathers: list[str] = []
        self.slot_copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._opname + "." + func._overloadname
        inputs = {_storage(a) for a in args if isinstance(a, torch.Tensor)}
        if name in _GATHERS and self.storage in inputs:
            self.gathers.append(name)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (
                isinstance(t, torch.Tensor)
                and tuple(t.shape[-2:]) == self.slot_shape
                and _storage(t) not in inputs | {self.storage}
            ):
                self.slot_copies.append(f"{name} {tuple(t.shape)}")
        return out


def test_graph_path_step_reads_the_cache_in_place(model: TalkerModel) -> None:
    config = _config(True, max_slots=4, batch_buckets=(2,))
    runner = TalkerRunner(model.talker, config)
    assert runner.graphs is not None
    bucket = runner.graphs.buckets[4]
    bucket.active.fill_(True)
    with _KVReads(runner.cache.k) as reads:
        runner.graphs.captured["talker[B=4]"].replay()
    assert reads.gathers == [] and reads.slot_copies == []
    # The detector works: the same step gathering by slot index (the old graph path) is caught.
    rows = runner.table.rows(torch.arange(4))
    trailing = torch.zeros(4, model.talker.cfg.hidden_size)
    with _KVReads(runner.cache.k) as reads:
        decode_step(model.talker, runner.cache, rows, trailing, config.max_seq_len)
    assert "index.Tensor" in reads.gathers and reads.slot_copies


# --- the attention kernels ---------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=3),
    kernel=st.sampled_from(["sdpa", "flex"]),
    data=st.data(),
)
def test_in_place_attention_equals_attention_over_each_rows_prefix(lengths, kernel, data) -> None:
    max_len, heads, kv_heads, hd = 300, 4, 2, 16
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    b = len(lengths)
    q = torch.randn(b, heads, 1, hd, generator=gen)
    k = torch.randn(b, kv_heads, max_len, hd, generator=gen)
    v = torch.randn(b, kv_heads, max_len, hd, generator=gen)
    attn = InPlaceAttention(b, max_len, torch.device("cpu"), kernel)
    attn.set_lengths(torch.tensor(lengths))
    got = attn.attend(q, k, v, hd**-0.5, True)
    for row, n in enumerate(lengths):
        want = F.scaled_dot_product_attention(
            q[row : row + 1],
            k[row : row + 1, :, :n],
            v[row : row + 1, :, :n],
            scale=hd**-0.5,
            enable_gqa=True,
        )
        torch.testing.assert_close(got[row : row + 1], want, rtol=1e-5, atol=1e-5)


# --- batched noise -------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    steps_per_draw=st.integers(1, 5),
    steps=st.integers(1, 12),
    talker=st.booleans(),
    cp=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_noise_drawn_k_steps_at_once_equals_step_by_step(steps_per_draw, steps, talker, cp, seed) -> None:
    vocab, cp_vocab, cp_steps = 7, 5, 3
    params = SamplingParams(seed=seed, do_sample=talker, subtalker_do_sample=cp)
    noise = RequestNoise(params, vocab, cp_vocab, cp_steps, steps_per_draw=steps_per_draw)
    chunk = torch.full((steps_per_draw, noise.width), float("nan"))
    generator = torch.Generator().manual_seed(seed)

    def gumbel(n: int) -> torch.Tensor:
        u = torch.empty(n).uniform_(generator=generator)  # the draws of one stage, one at a time
        tiny = torch.finfo(torch.float32).tiny
        return -torch.log((-torch.log(u.clamp_min(tiny))).clamp_min(tiny))

    if talker:
        torch.testing.assert_close(noise.talker(), gumbel(vocab), rtol=0, atol=0)
    for _ in range(steps):
        row = chunk[noise.next_step(chunk)]
        want_cp = gumbel(cp_steps * cp_vocab) if cp else None  # the draw order: code predictor first
        want_talker = gumbel(vocab) if talker else None
        if want_cp is not None:
            torch.testing.assert_close(row[: cp_steps * cp_vocab], want_cp, rtol=0, atol=0)
        if want_talker is not None:
            torch.testing.assert_close(row[cp_steps * cp_vocab :], want_talker, rtol=0, atol=0)


# --- compact slots -------------------------------------------------------------------------------


class _Prompt:  # the parts of a TalkerPrompt the scheduler reads
    prefill_len = 4
    trailing = torch.zeros(1, 4)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "finish", "cancel", "step"]), st.integers(0, 7)), max_size=40
    )
)
def test_scheduler_keeps_running_requests_in_slots_0_to_n_minus_1(ops) -> None:
    """After any mix of arrivals, finishes and cancellations, running requests occupy exactly
    slots 0..n-1, and every move the runner is told about is (highest slot -> the hole)."""
    moves: list[tuple[str, int, int]] = []
    sched = Scheduler(
        EngineConfig(max_slots=4, max_seq_len=100), on_move=lambda r, s, d: moves.append((r.request_id, s, d))
    )
    where: dict[str, int] = {}  # request -> slot, as the runner sees it (prefill + moves)
    count = 0
    for op, pick in ops:
        running = [r for r in sched.requests if r.slot is not None]
        if op == "add":
            request = EngineRequest(f"r{count}", None, SamplingParams.greedy(), None, lambda e: None)  # type: ignore[arg-type]
            request.prompt, request.max_frames = _Prompt(), 50  # type: ignore[assignment]
            count += 1
            sched.add(request)
        elif op == "cancel" and running:
            running[pick % len(running)].cancelled.set()
        elif op == "finish" and running:
            target = running[pick % len(running)]
            moves.clear()
            sched.update(running, [r is target for r in running])
            for rid, src, dst in moves:
                assert where[rid] == src and src > dst
                where[rid] = dst
            continue
        moves.clear()
        out = sched.schedule()
        for rid, src, dst in moves:
            assert where[rid] == src and src > dst
            where[rid] = dst
        for request in out.prefill:
            where[request.request_id] = request.slot  # type: ignore[assignment]
        running = [r for r in sched.requests if r.slot is not None]
        assert sorted(r.slot for r in running) == list(range(len(running)))  # type: ignore[type-var]
        assert all(where[r.request_id] == r.slot for r in running)
        assert [r.slot for r in out.decode] == sorted(r.slot for r in out.decode)  # type: ignore[type-var]
