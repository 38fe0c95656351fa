"""The synthesis request schema shared by every process: sampling parameters (one spelling, one
defaults table), the frame budget, and the one validator (:mod:`.validation`)."""

from .budget import (
    DEFAULT_SLOT_POSITIONS,
    MAX_NEW_TOKENS_CAP,
    RUNAWAY_GUARD,
    RunawayGuard,
    check_max_new_tokens,
    frame_budget,
)
from .sampling import (
    BUILTIN_MAX_NEW_TOKENS,
    BUILTIN_SAMPLING,
    SAMPLING_FIELDS,
    SamplingParams,
    resolve_sampling,
    sampling_from_generation_config,
    sampling_to_options,
)
from .validation import RequestLimits, SynthesisPlan, plan_synthesis

__all__ = [
    "BUILTIN_MAX_NEW_TOKENS",
    "BUILTIN_SAMPLING",
    "DEFAULT_SLOT_POSITIONS",
    "MAX_NEW_TOKENS_CAP",
    "RUNAWAY_GUARD",
    "SAMPLING_FIELDS",
    "RequestLimits",
    "RunawayGuard",
    "SamplingParams",
    "SynthesisPlan",
    "check_max_new_tokens",
    "frame_budget",
    "plan_synthesis",
    "resolve_sampling",
    "sampling_from_generation_config",
    "sampling_to_options",
]
