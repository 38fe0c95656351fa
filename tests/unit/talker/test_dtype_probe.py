"""The talker's step for --dtype auto on CPU: the linears of one decode frame of the checkpoint's
own dimensions, each dtype with the kernels --linear auto keeps for it."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from talker_service.model.dtype_probe import checkpoint_talker_probe, talker_step_probe
from tests.helpers.fixtures import CKPT_DIR
from tts_common.auto_dtype import CANDIDATES
from tts_common.config import load_checkpoint_config
from tts_common.kernels import choice
from tts_common.kernels.cache import CACHE_ENV
from tts_common.kernels.candidates import family_kernels


def test_the_probe_times_a_frame_of_the_checkpoint_with_each_dtype_kernel_table(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    measured: list[tuple[str, tuple[int, ...]]] = []
    tables: dict[str, choice.KernelTable] = {}
    measure = choice.measure_kernels

    def counted(
        shapes: object, family: str, buckets: tuple[int, ...], kernels: tuple[str, ...]
    ) -> choice.KernelTable:
        measured.append((family, tuple(buckets)))
        tables[family] = measure(shapes, family, buckets, kernels=kernels)  # type: ignore[arg-type]
        return tables[family]

    monkeypatch.setattr("talker_service.model.dtype_probe.measure_kernels", counted)
    small = checkpoint_talker_probe(CKPT_DIR / "tiny_custom_voice")
    talker = load_checkpoint_config(CKPT_DIR / "tiny_custom_voice").model.talker
    deeper = talker_step_probe(dataclasses.replace(talker, num_hidden_layers=talker.num_hidden_layers + 1))
    assert small.stage == "talker" and small.buckets == (1, 8)
    assert talker_step_probe(talker).what == small.what
    assert deeper.what != small.what  # the checkpoint's dimensions are in the cache key
    calls = choice.frame_linear_calls(talker)
    for rows in small.buckets:
        for dtype in CANDIDATES:
            seconds = small.step_seconds(dtype, rows)
            assert math.isfinite(seconds) and seconds > 0
            assert seconds == pytest.approx(tables[dtype].step_seconds(calls, rows))
    assert measured == [("float32", (1, 8)), ("bfloat16", (1, 8))]  # each family once, every bucket


def test_with_int8_weights_the_probe_times_the_int8_kernels_of_each_activation_dtype(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    measured: list[tuple[str, tuple[str, ...]]] = []

    def recorded(
        shapes: object, family: str, buckets: tuple[int, ...], kernels: tuple[str, ...]
    ) -> choice.KernelTable:
        measured.append((family, kernels))
        table = choice.KernelTable(
            family, tuple(buckets), {s: {"k": dict.fromkeys(buckets, 1e-3)} for s in shapes}
        )  # type: ignore[attr-defined]
        table.choose()
        return table

    monkeypatch.setattr("talker_service.model.dtype_probe.measure_kernels", recorded)
    probe = checkpoint_talker_probe(CKPT_DIR / "tiny_custom_voice", "int8")
    assert "int8 weights" in probe.what
    assert probe.what != checkpoint_talker_probe(CKPT_DIR / "tiny_custom_voice").what
    for dtype in CANDIDATES:
        probe.step_seconds(dtype, 1)
    assert measured == [
        ("int8", family_kernels("int8", torch.float32)),
        ("int8", family_kernels("int8", torch.bfloat16)),
    ]
