"""Sampling parameters: one spelling per field, one defaults table, one set of checks.

Precedence of every field: explicit (the request) > the checkpoint's ``generation_config.json`` >
the built-in defaults below (the official wrapper's hard defaults, ARCHITECTURE.md §7). Field
names are those of the public ``SamplingOptions`` message; the official ``generation_config.json``
spells one of them ``subtalker_dosample``, translated in :func:`sampling_from_generation_config`
and nowhere else.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.v1 import tts_pb2

MAX_SEED = 2**64 - 1
"""Largest accepted seed (``SamplingOptions.seed`` is a uint64)."""

GENERATION_CONFIG_KEYS = {"subtalker_do_sample": "subtalker_dosample"}
"""Our field name -> its key in the official ``generation_config.json``, where they differ."""


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequestError(f"sampling.{name} must be > 0, got {value}")


def _probability(name: str, value: float) -> None:
    if not 0 < value <= 1:  # also false for NaN
        raise InvalidRequestError(f"sampling.{name} must be in (0, 1], got {value}")


def _top_k(name: str, value: int) -> None:
    if value < 0:
        raise InvalidRequestError(f"sampling.{name} must be >= 0 (0 disables top-k), got {value}")


def _seed(name: str, value: int | None) -> None:
    if value is not None and not 0 <= value <= MAX_SEED:
        raise InvalidRequestError(f"sampling.{name} must be in [0, 2**64), got {value}")


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "temperature": _positive,
    "top_k": _top_k,
    "top_p": _probability,
    "repetition_penalty": _positive,
    "subtalker_temperature": _positive,
    "subtalker_top_k": _top_k,
    "subtalker_top_p": _probability,
    "seed": _seed,
}


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters. Constructing one checks every field
    (:class:`~tts_common.errors.InvalidRequestError` with the field's name otherwise)."""

    do_sample: bool = True
    """Sample the first codebook (talker); False = greedy argmax. The repetition penalty still
    applies when greedy."""
    temperature: float = 0.9
    """Talker softmax temperature (> 0)."""
    top_k: int = 50
    """Talker top-k (0 disables)."""
    top_p: float = 1.0
    """Talker nucleus threshold in (0, 1]."""
    repetition_penalty: float = 1.05
    """Penalty over previously generated first-codebook codes (> 0; 1 = off)."""
    subtalker_do_sample: bool = True
    """Sample codebooks 1..15 (code predictor); False = greedy."""
    subtalker_temperature: float = 0.9
    """Code predictor temperature (> 0)."""
    subtalker_top_k: int = 50
    """Code predictor top-k (0 disables)."""
    subtalker_top_p: float = 1.0
    """Code predictor top-p in (0, 1]."""
    seed: int | None = None
    """Seed of the request's noise generator; None = nondeterministic (the gateway always sets
    one and reports it, so every served request can be replayed)."""

    def __post_init__(self) -> None:
        for name, check in _CHECKS.items():
            check(name, getattr(self, name))

    @classmethod
    def greedy(cls, repetition_penalty: float = 1.05) -> SamplingParams:
        """Greedy talker and code predictor (the official fixtures' setting)."""
        return cls(do_sample=False, subtalker_do_sample=False, repetition_penalty=repetition_penalty)

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` applied (None values are ignored: "not set")."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingParams))
"""Every sampling field, in declaration order (= the ``SamplingOptions`` field names)."""

BUILTIN_SAMPLING = SamplingParams()
"""The built-in defaults (official wrapper), used for fields generation_config.json lacks."""

BUILTIN_MAX_NEW_TOKENS = 2048
"""The official ``max_new_tokens`` default when generation_config.json has none."""


def sampling_from_generation_config(data: Mapping[str, Any]) -> tuple[SamplingParams, int]:
    """The checkpoint's defaults from ``generation_config.json`` over the built-ins:
    ``(sampling, max_new_tokens)``. Unknown keys are ignored."""
    values = {}
    for name in SAMPLING_FIELDS:
        key = GENERATION_CONFIG_KEYS.get(name, name)
        if name != "seed" and key in data:
            values[name] = data[key]
    max_new_tokens = int(data.get("max_new_tokens", BUILTIN_MAX_NEW_TOKENS))
    return BUILTIN_SAMPLING.replace(**values), max_new_tokens


def explicit_fields(options: tts_pb2.SamplingOptions) -> dict[str, Any]:
    """The sampling fields a ``SamplingOptions`` message sets (proto3 optional presence)."""
    return {name: getattr(options, name) for name in SAMPLING_FIELDS if options.HasField(name)}


def resolve_sampling(options: tts_pb2.SamplingOptions, defaults: SamplingParams) -> SamplingParams:
    """Explicit fields of ``options`` over ``defaults`` (checked; InvalidRequestError names the
    field). ``max_new_tokens`` is not a sampling parameter here (see ``tts_common.synthesis.budget``)."""
    return defaults.replace(**explicit_fields(options))


def sampling_to_options(params: SamplingParams) -> tts_pb2.SamplingOptions:
    """Every field of ``params`` set in a ``SamplingOptions`` (the seed only if it has one)."""
    values = {name: getattr(params, name) for name in SAMPLING_FIELDS}
    if values["seed"] is None:
        del values["seed"]
    return tts_pb2.SamplingOptions(**values)


def new_seed() -> int:
    """A random seed below 2**31 (fits every RNG API and JSON clients' numbers)."""
    return secrets.randbelow(2**31)


__all__ = [
    "BUILTIN_MAX_NEW_TOKENS",
    "BUILTIN_SAMPLING",
    "GENERATION_CONFIG_KEYS",
    "MAX_SEED",
    "SAMPLING_FIELDS",
    "SamplingParams",
    "explicit_fields",
    "new_seed",
    "resolve_sampling",
    "sampling_from_generation_config",
    "sampling_to_options",
]
