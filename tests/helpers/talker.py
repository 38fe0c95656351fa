"""Running the talker engine to completion in tests (the project's only decode loop)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from talker_service.engine import DoneEvent, EngineConfig, EngineEvent, FrameEvent, Generation, TalkerEngine
from talker_service.model.decode_attention import InPlaceAttention
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import PromptInputs, TalkerPrompt
from tts_common.synthesis import SamplingParams


def generate(
    model: TalkerModel,
    sources: Sequence[PromptInputs | TalkerPrompt],
    max_new_tokens: int | None,
    params: SamplingParams | Sequence[SamplingParams],
    max_seq_len: int = 256,
    linear: str = "auto",
) -> list[Generation]:
    """Generate every source at once (batched as one engine with a slot each; ``linear``: the
    engine's CPU linear kernels)."""
    plist = [params] * len(sources) if isinstance(params, SamplingParams) else list(params)
    config = EngineConfig(max_slots=max(len(sources), 1), max_seq_len=max_seq_len, linear=linear)
    with TalkerEngine(model, config) as engine:
        return engine.generate_all([(s, p, max_new_tokens) for s, p in zip(sources, plist)])


class Collector:
    """Thread-safe sink gathering one engine request's events (the engine's ``sink``)."""

    def __init__(self) -> None:
        self.frames: list[list[int]] = []
        self.done: DoneEvent | None = None
        self.event = threading.Event()

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, FrameEvent):
            assert event.index == len(self.frames)
            self.frames.append(event.codes)
        else:
            self.done = event
            self.event.set()

    def wait(self) -> DoneEvent:
        """The request's DoneEvent, once it came (fails the test after 120 s)."""
        assert self.event.wait(120), "request did not finish"
        assert self.done is not None
        return self.done


def wrong_partial_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A set_lengths whose partial block is one block too far (the bug a GPU would hide): what the
    talker's ``talker.block_lists`` self-check must catch."""
    right = InPlaceAttention.set_lengths

    def wrong(self: InPlaceAttention, lengths: torch.Tensor) -> None:
        right(self, lengths)
        if self.kernel == "flex":
            self._partial_idx[:, 0, 0, 0].add_(1).clamp_(max=self._blocks - 1)

    monkeypatch.setattr(InPlaceAttention, "set_lengths", wrong)
