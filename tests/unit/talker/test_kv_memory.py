"""The talker KV cache sized from --kv-memory: the slot count, the startup errors, the flag, and
a CPU cache that costs only the positions requests reach."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from talker_service.config import FLAGS, engine_config_from_args
from talker_service.engine import EngineConfig, TalkerEngine
from talker_service.engine.kv_memory import KVBudgetError, kv_bytes_per_position, plan_kv_cache
from talker_service.model.loader import TalkerModel
from talker_service.server import TalkerServicer
from tests.helpers.fixtures import CKPT_DIR, fixture_prompt_inputs, load_requests
from tts_common.config import TalkerConfig
from tts_common.flags import config_from_args
from tts_common.memory import MemoryBudget, format_bytes, resident_bytes
from tts_common.stage_main import StageModelConfig
from tts_common.synthesis import SamplingParams

CKPT = CKPT_DIR / "tiny_custom_voice"


@pytest.fixture(scope="module")
def model() -> TalkerModel:
    return TalkerModel.from_checkpoint(CKPT)


def real_size_talker() -> TalkerConfig:
    """The released 0.6B talker's KV dimensions (28 layers, 8 KV heads of 128)."""
    return TalkerConfig(text_vocab_size=151936, num_hidden_layers=28, num_key_value_heads=8, head_dim=128)


def test_real_size_slot_is_448_mib_in_float32() -> None:
    cfg = real_size_talker()
    assert 2048 * kv_bytes_per_position(cfg, torch.float32) == 448 * 2**20
    assert 2048 * kv_bytes_per_position(cfg, torch.bfloat16) == 224 * 2**20


@given(
    budget=st.integers(min_value=1, max_value=2**40),
    max_slots=st.integers(min_value=1, max_value=64),
    positions=st.integers(min_value=1, max_value=8192),
    graphs=st.booleans(),
)
def test_slots_are_what_fits_the_budget(budget: int, max_slots: int, positions: int, graphs: bool) -> None:
    cfg = real_size_talker()
    config = EngineConfig(
        max_slots=max_slots,
        max_seq_len=positions,
        kv_memory=MemoryBudget(nbytes=budget),
        device="cuda" if graphs else "cpu",
    )
    per_slot = positions * kv_bytes_per_position(cfg, torch.float32)
    if budget < per_slot:
        with pytest.raises(KVBudgetError, match="raise --kv-memory or lower --max-seq-len"):
            plan_kv_cache(cfg, config, torch.float32)
        return
    plan = plan_kv_cache(cfg, config, torch.float32)
    assert 1 <= plan.slots <= max_slots and plan.positions == positions
    assert plan.total_bytes <= budget
    # Maximal: one more slot would either exceed the budget or the max_slots cap.
    assert plan.slots == max_slots or (plan.slots + 1) * per_slot > budget
    assert plan.describe() == (
        f"KV cache: {plan.slots} slots x {positions} positions, "
        f"{format_bytes(plan.total_bytes)} of {format_bytes(budget)} budget"
    )


def test_a_fraction_is_of_the_available_memory() -> None:
    cfg = real_size_talker()
    config = EngineConfig(max_slots=16, max_seq_len=2048, kv_memory=MemoryBudget(fraction=0.5))
    # 24 GB host, 3.6 GB of weights loaded: half of the rest holds 16 slots of 448 MiB (7 GiB).
    assert plan_kv_cache(cfg, config, torch.float32, available=20 * 10**9).slots == 16
    assert plan_kv_cache(cfg, config, torch.float32, available=4 * 2**30).slots == 4
    with pytest.raises(
        KVBudgetError, match=r"0\.5 \(224\.00 MiB of 448\.00 MiB available\) holds no KV slot"
    ):
        plan_kv_cache(cfg, config, torch.float32, available=448 * 2**20)
    # Measured when not given: this machine holds at least one tiny slot.
    assert plan_kv_cache(cfg, dataclasses.replace(config, max_seq_len=8), torch.float32).slots >= 1


def test_the_budget_comes_after_the_other_stages_share() -> None:
    cfg = real_size_talker()
    share = 12 * 2**30
    config = EngineConfig(max_slots=64, max_seq_len=2048, other_stages_memory=share)
    per_slot = 2048 * kv_bytes_per_position(cfg, torch.float32)
    plan = plan_kv_cache(cfg, config, torch.float32, available=20 * 10**9)
    assert plan.slots == int(0.5 * (20 * 10**9 - share)) // per_slot
    assert plan.describe().endswith("after 12.00 GiB for the stages beside it")
    with pytest.raises(KVBudgetError, match="holds no KV slot"):
        plan_kv_cache(cfg, config, torch.float32, available=share)
    assert talker_args("--other-stages-memory", "3GiB").other_stages_memory == 3 * 2**30
    with pytest.raises(SystemExit):
        talker_args("--other-stages-memory", "0.5")


def talker_args(*argv: str):
    return FLAGS.parser().parse_args(["--model", str(CKPT), *argv])


def test_kv_memory_flag_and_environment() -> None:
    model_cfg = config_from_args(StageModelConfig, talker_args())
    assert engine_config_from_args(model_cfg, talker_args()).kv_memory == MemoryBudget(fraction=0.5)
    got = engine_config_from_args(model_cfg, talker_args("--kv-memory", "6GiB"))
    assert got.kv_memory == MemoryBudget(nbytes=6 * 2**30)


@pytest.mark.parametrize("value", ["2", "lots", "4XB", "1.5"])
def test_malformed_kv_memory_is_a_usage_error_naming_the_flag(value: str) -> None:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exc:
        talker_args("--kv-memory", value)
    assert exc.value.code == 2
    assert "--kv-memory" in stderr.getvalue() and "invalid memory budget" in stderr.getvalue()


def test_servicer_sizes_the_engine_from_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    per_slot = 512 * kv_bytes_per_position(TalkerModel.from_checkpoint(CKPT).talker.cfg, torch.float32)
    config = EngineConfig(max_slots=8, max_seq_len=512, kv_memory=MemoryBudget(nbytes=3 * per_slot + 1))
    servicer = TalkerServicer(str(CKPT), config)
    with caplog.at_level(logging.INFO, logger="talker_service"):
        asyncio.run(servicer.load())
    try:
        assert servicer.engine is not None and servicer.info is not None
        assert servicer.engine_config.max_slots == 3 and servicer.engine_config.graph_buckets == (1, 2, 3)
        assert servicer.engine.runner.cache.num_slots == 3 and servicer.info.max_batch_size == 3
        cache = servicer.engine.runner.cache
        assert servicer.engine.runner.kv_bytes_per_slot == per_slot == 2 * cache.k[:, 0].nbytes
        assert "KV cache: 3 slots x 512 positions" in caplog.text
    finally:
        asyncio.run(servicer.close())


def test_cpu_cache_costs_only_the_positions_requests_reach(model: TalkerModel) -> None:
    request = load_requests("tiny_custom_voice")[0]
    job = [(fixture_prompt_inputs("tiny_custom_voice", request), SamplingParams.greedy(), 20)]

    def run(positions: int) -> tuple[int, int]:
        """(idle, busy) resident growth of an 8-slot engine of ``positions`` positions."""
        before = resident_bytes()
        with TalkerEngine(model, EngineConfig(max_slots=8, max_seq_len=positions)) as engine:
            assert engine.runner.cache.k.shape[3] == positions
            idle = resident_bytes() - before
            (out,) = engine.generate_all(job)
            assert len(out.codes) > 0
            return idle, resident_bytes() - before

    run(256)  # first-run costs (thread pools, kernel caches) out of the measurement
    small_idle, small_busy = run(256)
    positions = 1 << 16
    cache_bytes = 8 * positions * kv_bytes_per_position(model.talker.cfg, torch.float32)  # 256 MiB
    idle, busy = run(positions)
    # 256x the positions, the same request: the resident growth stays that of the small cache.
    assert idle - small_idle < cache_bytes // 32, (idle, small_idle, cache_bytes)
    assert busy - small_busy < cache_bytes // 32, (busy, small_busy, cache_bytes)
