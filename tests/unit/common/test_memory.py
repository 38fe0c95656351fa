"""Memory budgets (parsing, resolution), available memory and lazily committed CPU buffers."""

from __future__ import annotations

import argparse

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tts_common.memory import (
    MemoryBudget,
    available_memory,
    format_bytes,
    lazy_zeros,
    parse_memory_budget,
    resident_bytes,
)

MiB = 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5", MemoryBudget(fraction=0.5)),
        ("1", MemoryBudget(fraction=1.0)),
        (" .25 ", MemoryBudget(fraction=0.25)),
        ("4GiB", MemoryBudget(nbytes=4 * 2**30)),
        ("4G", MemoryBudget(nbytes=4 * 2**30)),
        ("4 gib", MemoryBudget(nbytes=4 * 2**30)),
        ("8GB", MemoryBudget(nbytes=8 * 10**9)),
        ("512MiB", MemoryBudget(nbytes=512 * MiB)),
        ("1.5GiB", MemoryBudget(nbytes=3 * 2**29)),
        ("100B", MemoryBudget(nbytes=100)),
        ("2kB", MemoryBudget(nbytes=2000)),
    ],
)
def test_parse_memory_budget(text: str, expected: MemoryBudget) -> None:
    assert parse_memory_budget(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2", "bare number is a fraction"),
        ("0", "bare number is a fraction"),
        ("1.01", "bare number is a fraction"),
        ("4XB", "unknown unit"),
        ("half", "invalid memory budget"),
        ("-1GiB", "invalid memory budget"),
        ("", "invalid memory budget"),
        ("0.1B", "at least 1 byte"),
        ("nan", "invalid memory budget"),
    ],
)
def test_malformed_budgets_say_why(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse_memory_budget(text)


@given(st.integers(min_value=1, max_value=2**50))
def test_byte_budgets_round_trip_through_their_text(n: int) -> None:
    budget = MemoryBudget(nbytes=n)
    assert parse_memory_budget(str(budget)) == budget
    assert budget.resolve(0) == n


@given(st.floats(min_value=1e-9, max_value=1.0), st.integers(min_value=0, max_value=2**50))
def test_fractions_round_trip_and_scale_the_available_memory(fraction: float, available: int) -> None:
    budget = MemoryBudget(fraction=fraction)
    assert parse_memory_budget(str(budget)) == budget
    resolved = budget.resolve(available)
    assert resolved == int(fraction * available) and 0 <= resolved <= available


def test_budget_is_a_fraction_or_bytes() -> None:
    for bad in ({}, {"fraction": 0.5, "nbytes": 1}, {"fraction": 1.5}, {"nbytes": 0}):
        with pytest.raises(ValueError):
            MemoryBudget(**bad)  # type: ignore[arg-type]


def test_available_cpu_memory_is_positive_and_below_the_total() -> None:
    total = next(
        int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:")
    )
    assert 0 < available_memory("cpu") <= total


def test_lazy_zeros_read_as_zeros_and_commit_only_what_is_written() -> None:
    size = 256 * MiB
    before = resident_bytes()
    t = lazy_zeros((64, size // 64 // 4), torch.float32)
    assert t.shape == (64, size // 256) and t.dtype == torch.float32
    # Reading untouched rows maps the shared zero page: still zeros, still not resident.
    assert t[:, :1024].abs().sum().item() == 0 and t[7].abs().sum().item() == 0
    t[3, :100] = 1.0
    assert resident_bytes() - before < size // 8
    assert t.sum().item() == 100
    # The measurement can see commitment: writing every row makes the buffer resident.
    t.fill_(2.0)
    assert resident_bytes() - before > size * 3 // 4
    del t
    assert resident_bytes() - before < size // 8  # unmapped with the last view


@given(
    st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=3),
    st.sampled_from(["float32", "bfloat16"]),
)
def test_lazy_zeros_match_torch_zeros(shape: list[int], dtype: str) -> None:
    t = lazy_zeros(tuple(shape), getattr(torch, dtype))
    assert torch.equal(t, torch.zeros(shape, dtype=getattr(torch, dtype)))
    t += 1  # writable
    assert torch.equal(t, torch.ones(shape, dtype=getattr(torch, dtype)))


def test_format_bytes() -> None:
    assert format_bytes(3 * 2**29) == "1.50 GiB" and format_bytes(2**30) == "1.00 GiB"
    assert format_bytes(448 * 2**20) == "448.00 MiB" and format_bytes(0) == "0.00 MiB"
