"""Running the talker engine to completion in tests (the project's only decode loop)."""

from __future__ import annotations

from collections.abc import Sequence

from talker_service.engine import EngineConfig, Generation, TalkerEngine
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import PromptInputs, TalkerPrompt
from tts_common.synthesis import SamplingParams


def generate(
    model: TalkerModel,
    sources: Sequence[PromptInputs | TalkerPrompt],
    max_new_tokens: int | None,
    params: SamplingParams | Sequence[SamplingParams],
    max_seq_len: int = 256,
) -> list[Generation]:
    """Generate every source at once (batched as one engine with a slot each)."""
    plist = [params] * len(sources) if isinstance(params, SamplingParams) else list(params)
    config = EngineConfig(max_slots=max(len(sources), 1), max_seq_len=max_seq_len)
    with TalkerEngine(model, config) as engine:
        return engine.generate_all([(s, p, max_new_tokens) for s, p in zip(sources, plist)])
