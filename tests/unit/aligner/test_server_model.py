"""The aligner servicer end to end with the REAL model (aligner_service.model on the parity
fixture checkpoint, tests/fixtures/aligner/ckpt): each case's audio and text through Align give
the official aligner's final items (words after the official split, times after the official
repair, in seconds rounded to ms), in five languages, alone and batched together."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from aligner_service.config import AlignerConfig
from aligner_service.model import AlignInput, load_aligner
from aligner_service.server import AlignerServicer
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc

from .test_server import run, started, stopped

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "aligner"
CASES: dict[str, dict[str, Any]] = json.loads((FIXTURE / "cases.json").read_text(encoding="utf-8"))["cases"]


def case_request(name: str) -> stages_pb2.AlignRequest:
    """The case's audio as the official code read it (int16 / 32768 x scale), downmixed to mono
    the way the official code and our model do (the float32 mean over channels)."""
    case = CASES[name]
    audio = np.load(FIXTURE / f"{name}.npz")["audio"].astype(np.float32) / np.float32(32768.0)
    audio = audio * np.float32(case["scale"])
    if audio.ndim == 2:
        audio = audio.mean(axis=1, dtype=np.float32)
    return stages_pb2.AlignRequest(
        request_id=f"case-{name}",
        pcm=audio.astype("<f4").tobytes(),
        sample_rate=case["sample_rate"],
        text=case["text"],
        language=case["language"],
    )


def official_items(name: str) -> list[tuple[str, float, float]]:
    return [(text, start, end) for text, start, end in CASES[name]["items"]]


def served_items(reply: stages_pb2.AlignResponse) -> list[tuple[str, float, float]]:
    # The official result is round(ms / 1000, 3) of the repaired integer milliseconds.
    return [(u.text, round(u.start_ms / 1000.0, 3), round(u.end_ms / 1000.0, 3)) for u in reply.units]


def align_all(max_batch_size: int) -> tuple[dict[str, stages_pb2.AlignResponse], list[int]]:
    servicer = AlignerServicer(
        str(FIXTURE / "ckpt"),
        AlignerConfig(max_batch_size=max_batch_size, batch_wait_ms=200.0),
        load_model=load_aligner,
        make_input=AlignInput,
    )

    async def main() -> tuple[dict[str, stages_pb2.AlignResponse], list[int]]:
        server, target = await started(servicer)
        sizes: list[int] = []
        assert servicer.model is not None
        predict = servicer.model.predict_classes

        def recording(batch):  # what one forward pass carried
            sizes.append(len(batch))
            return predict(batch)

        assert servicer.batcher is not None
        servicer.batcher._run_batch = recording
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = stages_pb2_grpc.AlignerStub(channel)
                replies = await asyncio.gather(*(stub.Align(case_request(n), timeout=120) for n in CASES))
            return dict(zip(CASES, replies)), sizes
        finally:
            await stopped(server, servicer)

    return run(main(), timeout=300)


@pytest.mark.parametrize("max_batch_size", [1, 8])
def test_align_gives_the_official_items(max_batch_size: int) -> None:
    replies, sizes = align_all(max_batch_size)
    assert sum(sizes) == len(CASES) and max(sizes) <= max_batch_size
    if max_batch_size > 1:  # sent together: some share a forward pass (the model's padding path)
        assert max(sizes) > 1, sizes
    for name, reply in replies.items():
        assert [u.text for u in reply.units] == CASES[name]["words"], name
        # Batched logits may differ from single ones in the last bits (near ties): the fixture's
        # margins are all > 1e-3, so the classes, and the repaired times, must match.
        assert served_items(reply) == official_items(name), name
        text = CASES[name]["text"]
        for unit in reply.units:  # spans hold the unit (outside Japanese, exactly its kept characters)
            assert 0 <= unit.char_start < unit.char_end <= len(text)
        starts = [u.start_ms for u in reply.units]
        assert starts == sorted(starts)


def test_bfloat16_stage_serves_the_same_words() -> None:
    """``--dtype bfloat16`` reaches the model (bf16 logits are coarse, so its times are checked for
    shape, not equality: tests/unit/aligner/test_model.py pins bf16 numerics)."""
    servicer = AlignerServicer(
        str(FIXTURE / "ckpt"), AlignerConfig(dtype="bfloat16"), load_model=load_aligner, make_input=AlignInput
    )

    async def main() -> tuple[stages_pb2.AlignerInfo, stages_pb2.AlignResponse]:
        server, target = await started(servicer)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = stages_pb2_grpc.AlignerStub(channel)
                info = await stub.GetModelInfo(stages_pb2.GetModelInfoRequest(), timeout=10)
                return info, await stub.Align(case_request("english"), timeout=120)
        finally:
            await stopped(server, servicer)

    info, reply = run(main(), timeout=300)
    assert info.dtype == "bfloat16"
    assert [u.text for u in reply.units] == CASES["english"]["words"]
    times = [t for u in reply.units for t in (u.start_ms, u.end_ms)]
    assert times == sorted(times) and all(t % 80 == 0 for t in times)
