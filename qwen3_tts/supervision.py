"""How ``qwen3-tts up`` keeps its processes alive.

The rule, per process (:func:`after_exit`):

* a stage replica that exits is restarted, after a delay that doubles with each exit
  (:attr:`RestartPolicy.initial_delay_s`, capped at :attr:`RestartPolicy.max_delay_s`) and starts
  again from the initial delay once the replica has served for
  :attr:`RestartPolicy.stable_after_s`;
* a replica that exits :attr:`RestartPolicy.max_failed_starts` times in a row without reporting
  SERVING in between is given up on, alone and loudly: the other replicas keep serving;

and for the stack (:class:`Supervisor`): only the gateway's exit, or a stage left without any
replica (every one given up on), stops it. The rule is the same for every stage (talker, decoder,
speaker, aligner, however many replicas each has): the optional stages (speaker, aligner) are
supervised like the others, since the user asked for what they serve.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

GATEWAY = "gateway"


class Supervised(Protocol):
    """A process of the stack (:class:`qwen3_tts.local_stack.StageProcess`)."""

    name: str
    process: subprocess.Popen | None

    @property
    def address(self) -> str: ...


@dataclass(frozen=True)
class RestartPolicy:
    """When a process of ``qwen3-tts up`` that exited is started again."""

    initial_delay_s: float = 1.0
    """Delay before restarting a replica that exited after a stable run."""

    max_delay_s: float = 30.0
    """The doubling delay stops growing here."""

    max_failed_starts: int = 5
    """A replica that exits this many times in a row before ever reporting SERVING is given up on
    (a bad flag, a port taken, a model it cannot load: restarting will not help)."""

    stable_after_s: float = 60.0
    """A replica that served this long before it exited has recovered: its next delay is
    :attr:`initial_delay_s` again."""


@dataclass(frozen=True)
class ExitHistory:
    """What :func:`after_exit` remembers of one replica."""

    exits: int = 0
    """Exits since the replica last served for :attr:`RestartPolicy.stable_after_s`."""

    failed_starts: int = 0
    """Exits in a row before reporting SERVING."""


def after_exit(
    policy: RestartPolicy, history: ExitHistory, served_s: float | None
) -> tuple[ExitHistory, float | None]:
    """A replica exited after serving for ``served_s`` seconds (None: it never reported SERVING
    since it was last started): its new history, and the delay before restarting it, or None
    to give up on it."""
    failed_starts = 0 if served_s is not None else history.failed_starts + 1
    stable = served_s is not None and served_s >= policy.stable_after_s
    exits = (0 if stable else history.exits) + 1
    updated = replace(history, exits=exits, failed_starts=failed_starts)
    if failed_starts >= policy.max_failed_starts:
        return updated, None
    return updated, min(policy.initial_delay_s * 2 ** (exits - 1), policy.max_delay_s)


def lost_stage(stages: dict[str, str], given_up: Collection[str]) -> str | None:
    """A stage whose every replica is in ``given_up``, if any (``stages``: process name ->
    its stage)."""
    for stage in dict.fromkeys(stages.values()):
        if all(name in given_up for name, of in stages.items() if of == stage):
            return stage
    return None


class StopSignal(Protocol):
    """The user's stop (:class:`qwen3_tts.local_stack.StopRequest`)."""

    @property
    def requested(self) -> bool: ...

    def settle(self) -> bool: ...


@dataclass
class _Replica:
    stage: Supervised
    started_at: float
    serving_since: float | None = None
    history: ExitHistory = field(default_factory=ExitHistory)
    restart_at: float | None = None
    given_up: bool = False
    restarts: int = 0


def _report(message: str) -> None:
    print(f"qwen3-tts up: {message}", file=sys.stderr, flush=True)


class Supervisor:
    """Watches the started processes of a stack and applies the rule of this module.

    ``stage_of`` names the group of replicas a process is one of (the stage, or a model's
    talkers; the gateway's is :data:`GATEWAY`); ``start``
    (re)starts a process (sets its ``process``); ``serving`` tells whether an address reports
    SERVING; ``clock`` and ``sleep`` are injectable for tests."""

    TICK_S = 0.2

    def __init__(
        self,
        stages: Iterable[Supervised],
        stage_of: Callable[[str], str],
        start: Callable[[Supervised], None],
        serving: Callable[[str], bool],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        report: Callable[[str], None] = _report,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self._stage_of = stage_of
        self._start = start
        self._serving = serving
        self._clock = clock
        self._sleep = sleep
        self._report = report
        now = clock()
        self.replicas = [_Replica(stage, now) for stage in stages]

    @property
    def given_up(self) -> list[str]:
        return [r.stage.name for r in self.replicas if r.given_up]

    def run(self, stop: StopSignal, on_serving: Callable[[], None], start_timeout: float) -> int:
        """Supervise until the user stops (0) or the stack must stop (1). ``on_serving`` runs
        once, when every process not given up on has reported SERVING; raises TimeoutError if
        that takes longer than ``start_timeout`` seconds."""
        begun = self._clock()
        announced = False
        while not stop.requested:
            for replica in self.replicas:
                outcome = self._step(replica, stop)
                if outcome is not None:
                    return outcome
            if not announced:
                waiting = [r.stage.name for r in self.replicas if not r.given_up and r.serving_since is None]
                if not waiting:
                    announced = True
                    on_serving()
                elif self._clock() - begun > start_timeout:
                    raise TimeoutError(f"not serving after {start_timeout:.0f} s: {', '.join(waiting)}")
            self._sleep(self.TICK_S)
        return 0

    def _step(self, replica: _Replica, stop: StopSignal) -> int | None:
        if replica.given_up:
            return None
        name = replica.stage.name
        now = self._clock()
        if replica.restart_at is not None:
            if now >= replica.restart_at:
                self._start(replica.stage)
                replica.started_at, replica.serving_since, replica.restart_at = now, None, None
                replica.restarts += 1
            return None
        process = replica.stage.process
        assert process is not None
        code = process.poll()
        if code is None:
            if replica.serving_since is None and self._serving(replica.stage.address):
                replica.serving_since = now
                if replica.restarts:
                    self._report(f"{name} is serving again (restart {replica.restarts})")
            return None
        if stop.settle():  # the child saw the user's Ctrl-C first
            return 0
        if self._stage_of(name) == GATEWAY:
            self._report(f"gateway exited with code {code}; stopping")
            return 1
        served = None if replica.serving_since is None else now - replica.serving_since
        replica.history, delay = after_exit(self.policy, replica.history, served)
        if delay is None:
            replica.given_up = True
            self._report(
                f"GIVING UP on {name}: it exited {replica.history.failed_starts} times in a row "
                f"without reporting SERVING (last exit code {code}); it stays down, see its output above"
            )
            stages = {r.stage.name: self._stage_of(r.stage.name) for r in self.replicas}
            lost = lost_stage(stages, self.given_up)
            if lost is not None:
                self._report(f"no {lost} replica left; stopping")
                return 1
            others = [n for n, of in stages.items() if of == stages[name] and n not in self.given_up]
            self._report(f"the other {stages[name]} replicas keep serving: {', '.join(others)}")
            return None
        replica.restart_at = now + delay
        when = "before reporting SERVING" if served is None else f"after serving {served:.0f} s"
        self._report(f"{name} exited with code {code} {when}; restarting it in {delay:.0f} s")
        return None
