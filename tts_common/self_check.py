"""Self-checks of a stage's fast path (captured graphs, FlexAttention), and the fallback to eager.

A model stage verifies its graph path on the device it lands on before it reports SERVING (short
form) and ``qwen3-tts doctor`` runs the same checks in full. Each check is a named function that
raises :class:`CheckFailedError` (or anything else: a compile error is a failure too) and returns
details to report. :func:`run_checks` runs them into a :class:`SelfCheckReport`;
:func:`choose_graph_path` applies ``--cuda-graphs`` to the outcome: ``on`` makes a failure fatal
(:class:`GraphPathError`), ``auto`` falls back to the eager path with an ERROR log naming the check,
a metric (``qwen3tts_self_check_failures_total{stage,check}``) and the reason kept for the model
info; ``off`` never builds the graph path.

The stage-specific checks live with their stage (``talker_service.engine.self_check``,
``decoder_service.model.self_check``); this module holds what they share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

logger = logging.getLogger(__name__)

CudaGraphsChoice = Literal["auto", "on", "off"]
CUDA_GRAPHS_CHOICES: tuple[str, ...] = ("auto", "on", "off")

T = TypeVar("T")


def check_graph_device(choice: str, device: object, emulated: bool = False) -> None:
    """``--cuda-graphs on`` needs a cuda device (or the CPU emulation of the graph path, a
    test setting): raise ValueError naming ``device`` otherwise."""
    if choice == "on" and not emulated and getattr(device, "type", None) != "cuda":
        raise ValueError(f"--cuda-graphs on needs a cuda device, not {device}")


class CheckFailedError(AssertionError):
    """A self-check found a mismatch; the message says what and where."""


class GraphPathError(RuntimeError):
    """``--cuda-graphs on`` and the graph path failed a self-check (or could not be built)."""


@dataclass
class CheckResult:
    """One named check: passed or not, why, how long it took, and figures to report."""

    name: str
    passed: bool
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "details": self.details,
        }


@dataclass
class SelfCheckReport:
    """The checks of one stage, in the order they ran."""

    stage: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def describe_failure(self) -> str:
        """``check: reason`` of every failed check ("" when all passed)."""
        return "; ".join(f"{c.name}: {c.reason}" for c in self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "passed": self.passed, "checks": [c.to_dict() for c in self.checks]}


def run_check(name: str, check: Callable[[], dict[str, Any] | None]) -> CheckResult:
    """Run one check: a :class:`CheckFailedError` or any other exception is a failure with its reason."""
    t0 = time.perf_counter()
    try:
        details = check() or {}
    except Exception as exc:  # noqa: BLE001 - a compile or runtime error is a failed check
        reason = str(exc) if isinstance(exc, CheckFailedError) else f"{type(exc).__name__}: {exc}"
        return CheckResult(name, False, reason, time.perf_counter() - t0)
    return CheckResult(name, True, "", time.perf_counter() - t0, details)


def run_checks(
    stage: str,
    checks: Sequence[tuple[str, Callable[[], dict[str, Any] | None]]],
    stop_at_failure: bool = False,
) -> SelfCheckReport:
    """Run ``checks`` in order into a report (``stop_at_failure``: skip the rest after one fails)."""
    report = SelfCheckReport(stage)
    for name, check in checks:
        result = run_check(name, check)
        report.checks.append(result)
        if stop_at_failure and not result.passed:
            break
    return report


@dataclass
class GraphPathOutcome:
    """What :func:`choose_graph_path` decided for a stage."""

    graphs: Any | None
    """The checked graph path, or None (eager)."""
    report: SelfCheckReport
    fallback_reason: str = ""
    """Why the stage runs eager although graphs were wanted ("" otherwise)."""


def choose_graph_path(
    stage: str,
    choice: str,
    build: Callable[[], T],
    checks: Callable[[T], Sequence[tuple[str, Callable[[], dict[str, Any] | None]]]],
) -> GraphPathOutcome:
    """Build the graph path (``build``: captures every bucket) and self-check it (``checks``);
    apply ``--cuda-graphs`` (``choice``) to a failure. See the module docstring."""
    if choice not in CUDA_GRAPHS_CHOICES:
        raise ValueError(f"--cuda-graphs must be one of {CUDA_GRAPHS_CHOICES}, not {choice!r}")
    built: list[T] = []

    def capture() -> dict[str, Any]:
        built.append(build())
        return {}

    report = run_checks(stage, [(f"{stage}.capture", capture)])
    if built:
        report.checks += run_checks(stage, checks(built[0]), stop_at_failure=True).checks
    if report.passed:
        logger.info("%s graph path: self-check passed (%s)", stage, ", ".join(c.name for c in report.checks))
        return GraphPathOutcome(built[0], report)
    reason = report.describe_failure()
    if choice == "on":
        raise GraphPathError(f"{stage} graph path failed its self-check (--cuda-graphs on): {reason}")
    from . import metrics

    for failed in report.failures:
        metrics.SELF_CHECK_FAILURES.labels(stage=stage, check=failed.name).inc()
        logger.error(
            "%s graph path self-check %s FAILED: %s; serving on the eager path (slower, same audio)",
            stage,
            failed.name,
            failed.reason,
        )
    return GraphPathOutcome(None, report, f"self-check failed, eager fallback: {reason}")


def step_path(mode: str | None, fallback_reason: str = "") -> str:
    """How a stage's step runs, as its model info reports it (``step_path``): ``<mode>-graphs``
    for a graph path of capture ``mode`` (cuda, emulated), else ``eager``, or ``eager (fallback)``
    when the graph path failed its self-check (``fallback_reason``)."""
    if mode is not None:
        return f"{mode}-graphs"
    return "eager (fallback)" if fallback_reason else "eager"


__all__ = [
    "CUDA_GRAPHS_CHOICES",
    "CheckFailedError",
    "CheckResult",
    "CudaGraphsChoice",
    "GraphPathError",
    "GraphPathOutcome",
    "SelfCheckReport",
    "check_graph_device",
    "choose_graph_path",
    "run_check",
    "run_checks",
    "step_path",
]
