"""The timestamp repair: equal to the official ``fix_timestamp`` on recorded cases and (where the
official environment exists) on hypothesis' cases, and the properties the repair promises."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aligner_service.text import repair_timestamps, repaired_unit_times
from aligner_service.text.repair import longest_non_decreasing

from .conftest import load_cases

_, REPAIR_CASES = load_cases("repair_cases.json")

# Millisecond values as the model emits them: a class (0..4999) times 80.
TIMESTAMPS = st.lists(st.integers(0, 4999).map(lambda c: c * 80.0), max_size=60)
NEAR_SORTED = st.lists(st.integers(0, 60), min_size=1, max_size=60).flatmap(
    lambda base: st.lists(st.integers(0, 80), min_size=len(base), max_size=len(base)).map(
        lambda noise: [80.0 * (b + (n if n > 60 else 0)) for b, n in zip(sorted(base), noise)]
    )
)


def test_recorded_cases_are_many() -> None:
    assert len(REPAIR_CASES) >= 200
    assert any(case["values"] != case["repaired"] for case in REPAIR_CASES)


@pytest.mark.parametrize("index", range(len(REPAIR_CASES)))
def test_equals_official_on_recorded_cases(index: int) -> None:
    case = REPAIR_CASES[index]
    assert repair_timestamps(case["values"]) == case["repaired"]


@given(values=st.one_of(TIMESTAMPS, NEAR_SORTED).filter(bool))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_equals_official_live(official_oracle, values: list[float]) -> None:
    assert repair_timestamps(values) == official_oracle.repair(values)


def _longest_non_decreasing_length(values: list[float]) -> int:
    tails: list[float] = []
    for v in values:
        k = bisect.bisect_right(tails, v)
        tails[k : k + 1] = [v]
    return len(tails)


@given(values=st.one_of(TIMESTAMPS, NEAR_SORTED))
@settings(max_examples=300, deadline=None)
def test_repair_properties(values: list[float]) -> None:
    repaired = repair_timestamps(values)
    assert len(repaired) == len(values)
    assert all(a <= b for a, b in zip(repaired, repaired[1:])), "not monotonic"
    normal = longest_non_decreasing(values)
    assert sum(normal) == _longest_non_decreasing_length(values)
    kept = [v for v, n in zip(values, normal) if n]
    assert all(a <= b for a, b in zip(kept, kept[1:]))
    for v, r, n in zip(values, repaired, normal):
        if n:
            assert r == int(v), "a reference value was rewritten"
    if values:
        assert min(values) <= min(repaired) and max(repaired) <= max(values)
    if values == sorted(values):
        assert repaired == [int(v) for v in values]


def test_short_runs_copy_the_nearer_neighbour_and_long_runs_interpolate() -> None:
    assert repair_timestamps([0, 800, 80, 160]) == [0, 0, 80, 160]  # a tie goes left
    assert repair_timestamps([0, 900, 900, 160, 240, 320]) == [0, 0, 160, 160, 240, 320]
    # A run of three between 0 and 400 ms: 100, 200, 300.
    assert repair_timestamps([0, 900, 950, 990, 400, 480, 560, 640]) == [0, 100, 200, 300, 400, 480, 560, 640]
    assert repair_timestamps([]) == []


@given(
    st.lists(st.integers(0, 4999), max_size=30).map(lambda c: c + c[: len(c) % 2]),
    st.sampled_from([80.0, 40.0]),
)
def test_unit_times_pair_the_repaired_classes(classes: list[int], resolution: float) -> None:
    """Unit i's (start, end) are the repaired values 2i and 2i + 1 of the classes in ms; the
    model giving another number of classes than two per unit is an error, never a shifted pair."""
    units = len(classes) // 2
    repaired = repair_timestamps([c * resolution for c in classes])
    assert repaired_unit_times(classes, resolution, units) == [
        (repaired[2 * i], repaired[2 * i + 1]) for i in range(units)
    ]
    with pytest.raises(RuntimeError, match="timestamps for"):
        repaired_unit_times(classes, resolution, units + 1)
