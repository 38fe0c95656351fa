"""The official timestamp repair (``Qwen3ForceAlignProcessor.fix_timestamp``, qwen-asr 0.0.6),
reimplemented.

The model predicts each unit's start and end independently, so a few can go backwards. The
repair keeps the longest non-decreasing subsequence as the reference ("normal" values) and
rewrites every maximal run of the others:

* a run of at most 2 takes, per position, the nearer normal neighbour's value (the left one on a
  tie; the only one at either end);
* a longer run between two normal values is interpolated linearly between them (the only
  neighbour's value at either end);

and every value is truncated with ``int()``. Which longest subsequence is chosen matters; it is the
official one: for each position the predecessor is the EARLIEST earlier value <= it among those
with the longest run, and the subsequence ends at the earliest position where the longest run
ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def longest_non_decreasing(values: Sequence[float]) -> list[bool]:
    """Per position, whether it belongs to the official choice of the longest non-decreasing
    subsequence of ``values``."""
    n = len(values)
    data = np.asarray(values, dtype=np.float64)
    length = np.ones(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    for i in range(1, n):
        # Earlier values that may precede values[i]; argmax picks the first of the longest.
        candidates = np.where(data[:i] <= data[i], length[:i], 0)
        best = int(np.argmax(candidates))
        if candidates[best] > 0:
            length[i] = candidates[best] + 1
            parent[i] = best
    normal = [False] * n
    idx = int(np.argmax(length)) if n else -1
    while idx != -1:
        normal[idx] = True
        idx = int(parent[idx])
    return normal


def repair_timestamps(values: Sequence[float]) -> list[int]:
    """The repaired timestamps (same length, non-decreasing, truncated to ``int``)."""
    result = [float(v) for v in values]
    n = len(result)
    normal = longest_non_decreasing(result)
    i = 0
    while i < n:
        if normal[i]:
            i += 1
            continue
        j = i
        while j < n and not normal[j]:
            j += 1
        # Normal values are never rewritten, so the neighbours can be read from result.
        left = result[i - 1] if i > 0 else None
        right = result[j] if j < n else None
        if left is None or right is None:
            fill = right if left is None else left
            for k in range(i, j):
                result[k] = fill  # type: ignore[assignment]
        elif j - i <= 2:
            for k in range(i, j):
                result[k] = left if k - (i - 1) <= j - k else right
        else:
            step = (right - left) / (j - i + 1)
            for k in range(i, j):
                result[k] = left + step * (k - i + 1)
        i = j
    return [int(v) for v in result]


def repaired_unit_times(classes: Sequence[int], resolution_ms: float, units: int) -> list[tuple[int, int]]:
    """Each of ``units`` units' (start, end) in milliseconds: the model's raw classes ``2i`` and
    ``2i + 1`` times ``resolution_ms``, repaired over the whole utterance
    (:func:`repair_timestamps`). RuntimeError when the model gave another number of classes."""
    if len(classes) != 2 * units:
        raise RuntimeError(f"the aligner gave {len(classes)} timestamps for {units} units")
    ms = repair_timestamps([c * resolution_ms for c in classes])
    return list(zip(ms[::2], ms[1::2]))


__all__ = ["longest_non_decreasing", "repair_timestamps", "repaired_unit_times"]
