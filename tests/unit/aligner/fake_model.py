"""A stand-in for ``aligner_service.model.ForcedAligner`` with the same interface, for the
server's tests: its classes are a function of each input alone (so rows mixed up between callers
of one batch are caught), and it records the batches it ran."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class FakeInput:
    audio: np.ndarray
    sample_rate: int
    words: list[str]


class FakeAligner:
    sample_rate = 16000
    timestamp_resolution_ms = 80.0
    max_audio_seconds = 30.0
    model_name = "fake-forced-aligner"

    def __init__(self, *, delay_s: float = 0.0, reverse: bool = False) -> None:
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.delay_s = delay_s
        self.reverse = reverse
        self.batches: list[list[FakeInput]] = []
        self.threads: set[str] = set()

    @staticmethod
    def expected_classes(item: FakeInput) -> list[int]:
        """Class k of an input: its duration in 10 ms steps plus k (rising)."""
        base = int(len(item.audio) * 100 // item.sample_rate)
        return [base + k for k in range(2 * len(item.words))]

    def predict_classes(self, batch: Sequence[FakeInput]) -> list[list[int]]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(batch))
        if self.delay_s:
            time.sleep(self.delay_s)
        for item in batch:
            if len(item.audio) * self.sample_rate < 400 * item.sample_rate:
                raise ValueError("audio is too short to align")
        rows = [self.expected_classes(item) for item in batch]
        return [row[::-1] for row in rows] if self.reverse else rows


def fake_loader(model: FakeAligner) -> Callable[..., FakeAligner]:
    """A ``load_aligner`` stand-in returning ``model``; its ``calls`` list records (path,
    device, dtype) of every load."""
    calls: list[tuple[str, str, torch.dtype]] = []

    def load(path: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> FakeAligner:
        calls.append((path, device, dtype))
        return model

    load.calls = calls  # type: ignore[attr-defined]
    return load
