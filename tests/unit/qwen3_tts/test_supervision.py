"""``qwen3-tts up``'s supervision (qwen3_tts.supervision): the restart rule as a property against
an independent statement of it, and the supervisor loop over scripted processes on a fake clock
(which replica is restarted when, which is given up on alone, what stops the stack)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qwen3_tts.local_stack import replica_name, stage_of
from qwen3_tts.supervision import ExitHistory, RestartPolicy, Supervisor, after_exit, lost_stage

POLICY = RestartPolicy(initial_delay_s=1.0, max_delay_s=8.0, max_failed_starts=3, stable_after_s=20.0)

policies = st.builds(
    RestartPolicy,
    initial_delay_s=st.floats(0.1, 5.0),
    max_delay_s=st.floats(5.0, 60.0),
    max_failed_starts=st.integers(1, 6),
    stable_after_s=st.floats(1.0, 100.0),
)
# One exit: None = before reporting SERVING, else the seconds it served.
exits = st.lists(st.one_of(st.none(), st.floats(0.0, 200.0)), min_size=1, max_size=30)


@given(policy=policies, events=exits)
def test_the_restart_rule(policy: RestartPolicy, events: list[float | None]) -> None:
    """After each exit: given up exactly when the last ``max_failed_starts`` exits all came before
    SERVING; otherwise restarted after ``initial * 2**(n-1)`` capped at ``max``, n counting the
    exits since the last run that served ``stable_after_s`` (that run's exit included)."""
    history = ExitHistory()
    for k, served in enumerate(events):
        history, delay = after_exit(policy, history, served)
        done = events[: k + 1]
        trailing_failures = len(done) - max((i + 1 for i, e in enumerate(done) if e is not None), default=0)
        if trailing_failures >= policy.max_failed_starts:
            assert delay is None
            break  # a replica given up on is never started again
        assert delay is not None
        stable = [i for i, e in enumerate(done) if e is not None and e >= policy.stable_after_s]
        n = k - stable[-1] + 1 if stable else k + 1  # the stable run's own exit counts as the first
        assert delay == pytest.approx(min(policy.initial_delay_s * 2 ** (n - 1), policy.max_delay_s))
        assert policy.initial_delay_s <= delay + 1e-12 and delay <= policy.max_delay_s + 1e-12


@given(policy=policies, served=st.lists(st.floats(0.0, 200.0), min_size=1, max_size=40))
def test_a_replica_that_serves_each_time_is_never_given_up(
    policy: RestartPolicy, served: list[float]
) -> None:
    history = ExitHistory()
    for seconds in served:
        history, delay = after_exit(policy, history, seconds)
        assert delay is not None and history.failed_starts == 0


@given(
    replicas=st.dictionaries(
        st.sampled_from(["talker", "decoder", "speaker"]), st.integers(1, 4), min_size=1, max_size=3
    ),
    data=st.data(),
)
def test_a_stage_is_lost_when_every_replica_is_given_up(
    replicas: dict[str, int], data: st.DataObject
) -> None:
    names = {replica_name(stage, k): stage for stage, n in replicas.items() for k in range(n)}
    given_up = data.draw(st.sets(st.sampled_from(sorted(names))))
    lost = lost_stage(names, given_up)
    fully = [s for s in replicas if all(n in given_up for n, of in names.items() if of == s)]
    assert (lost is None) == (not fully)
    assert lost is None or lost in fully


# ---------------------------------------------------------------------------------------------
# The supervisor over scripted processes


@dataclass
class Life:
    """One run of a process: reports SERVING ``serves_after`` s after its start (None: never),
    exits with ``code`` ``exits_after`` s after its start (None: never)."""

    serves_after: float | None = 0.5
    exits_after: float | None = None
    code: int = 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeProcess:
    def __init__(self, clock: Clock, life: Life) -> None:
        self.clock, self.life, self.started = clock, life, clock.now

    def poll(self) -> int | None:
        exits = self.life.exits_after
        return self.life.code if exits is not None and self.clock.now - self.started >= exits else None

    def serving(self) -> bool:
        serves = self.life.serves_after
        return self.poll() is None and serves is not None and self.clock.now - self.started >= serves


@dataclass
class Proc:
    name: str
    process: FakeProcess | None = None

    @property
    def address(self) -> str:
        return self.name


@dataclass
class World:
    """Processes whose successive runs follow a script (the last life repeats)."""

    clock: Clock
    scripts: dict[str, list[Life]]
    starts: dict[str, list[float]] = field(default_factory=dict)

    def start(self, proc: Proc) -> None:
        runs = self.starts.setdefault(proc.name, [])
        script = self.scripts.get(proc.name, [Life()])
        proc.process = FakeProcess(self.clock, script[min(len(runs), len(script) - 1)])
        runs.append(self.clock.now)

    def serving(self, address: str) -> bool:
        return self.by_name[address].process.serving()  # type: ignore[union-attr]

    by_name: dict[str, Proc] = field(default_factory=dict)


class Stop:
    """The user's Ctrl-C at ``at`` seconds (never by default)."""

    def __init__(self, clock: Clock, at: float = float("inf")) -> None:
        self.clock, self.at = clock, at

    @property
    def requested(self) -> bool:
        return self.clock.now >= self.at

    def settle(self) -> bool:
        return self.requested


def supervise(
    names: list[str],
    scripts: dict[str, list[Life]],
    stop_at: float = float("inf"),
    timeout: float = 600,
    group: Callable[[str], str] = stage_of,
) -> tuple[int, World, Supervisor, list[str], list[float]]:
    """Run a supervisor over scripted processes: (exit status, world, supervisor, reports,
    the times ``on_serving`` ran)."""
    clock = Clock()
    world = World(clock, scripts)
    procs = [Proc(n) for n in names]
    world.by_name = {p.name: p for p in procs}
    for proc in procs:
        world.start(proc)
    reports: list[str] = []
    announced: list[float] = []
    supervisor = Supervisor(
        procs,
        group,
        world.start,
        world.serving,
        POLICY,
        clock=clock,
        sleep=clock.sleep,
        report=reports.append,
    )
    code = supervisor.run(Stop(clock, stop_at), lambda: announced.append(clock.now), start_timeout=timeout)
    return code, world, supervisor, reports, announced


STACK = ["talker", "decoder", "speaker", "talker-2", "decoder-2", "gateway"]


def test_a_replica_failing_before_serving_is_given_up_alone() -> None:
    code, world, supervisor, reports, announced = supervise(
        STACK, {"talker-2": [Life(serves_after=None, exits_after=0.5, code=3)]}, stop_at=120
    )
    assert code == 0  # the user's stop, long after
    assert supervisor.given_up == ["talker-2"]
    assert len(world.starts["talker-2"]) == POLICY.max_failed_starts
    assert all(len(world.starts[n]) == 1 for n in STACK if n != "talker-2")
    assert any(r.startswith("GIVING UP on talker-2") and "exit code 3" in r for r in reports), reports
    assert any("keep serving: talker" in r for r in reports), reports
    assert len(announced) == 1, "the stack reports SERVING once the others serve"


@pytest.mark.parametrize("stage", ["talker", "decoder", "speaker"])
def test_losing_every_replica_of_a_stage_stops_the_stack(stage: str) -> None:
    """The same for every stage, the speaker replicated too."""
    names = [*STACK[:-1], "speaker-2", "gateway"]
    failing = [Life(serves_after=None, exits_after=0.5)]
    code, _, supervisor, reports, _ = supervise(names, {stage: failing, f"{stage}-2": failing})
    assert code == 1
    assert sorted(supervisor.given_up) == [stage, f"{stage}-2"]
    assert reports[-1] == f"no {stage} replica left; stopping"


def test_groups_are_what_the_caller_says() -> None:
    """Several models: each model's talkers are a group of their own (``up`` passes
    local_stack.replica_group); losing one model's talkers stops the stack even though another
    model's talker serves."""
    names = ["talker-design", "decoder", "talker-base", "speaker-base", "talker-base-2", "gateway"]
    group = {n: n.removesuffix("-2") for n in names}
    failing = [Life(serves_after=None, exits_after=0.5)]
    code, _, supervisor, reports, _ = supervise(
        names, {"talker-base": failing, "talker-base-2": failing}, group=group.__getitem__
    )
    assert code == 1 and sorted(supervisor.given_up) == ["talker-base", "talker-base-2"]
    assert reports[-1] == "no talker-base replica left; stopping"


def test_the_aligner_is_supervised_like_the_speaker() -> None:
    """The aligner (one per stack, like a one-model speaker): restarted after it exits, given
    up on after failing to start, and then the stack stops, as for the speaker."""
    names = ["talker", "decoder", "speaker", "aligner", "gateway"]
    code, world, supervisor, reports, _ = supervise(
        names, {"aligner": [Life(exits_after=5, code=-9), Life()]}, stop_at=30
    )
    assert code == 0 and not supervisor.given_up and len(world.starts["aligner"]) == 2
    assert "aligner is serving again (restart 1)" in reports
    failing = [Life(serves_after=None, exits_after=0.5)]
    for stage in ("speaker", "aligner"):
        code, _, supervisor, reports, _ = supervise(names, {stage: failing})
        assert code == 1 and supervisor.given_up == [stage]
        assert reports[-1] == f"no {stage} replica left; stopping"


def test_the_gateway_exit_stops_the_stack() -> None:
    code, world, _, reports, _ = supervise(STACK, {"gateway": [Life(exits_after=5, code=-9)]})
    assert code == 1 and reports[-1] == "gateway exited with code -9; stopping"
    assert len(world.starts["gateway"]) == 1


def test_a_single_replica_that_served_is_restarted() -> None:
    """One replica per stage: a talker killed after serving comes back (not a stop)."""
    names = ["talker", "decoder", "speaker", "gateway"]
    code, world, supervisor, reports, _ = supervise(
        names, {"talker": [Life(exits_after=5, code=-9), Life()]}, stop_at=30
    )
    assert code == 0 and not supervisor.given_up
    first, second = world.starts["talker"]
    assert second - first == pytest.approx(5 + POLICY.initial_delay_s, abs=Supervisor.TICK_S * 2)
    assert any(r.startswith("talker exited with code -9 after serving") for r in reports), reports
    assert "talker is serving again (restart 1)" in reports


def test_kills_right_after_serving_back_off_and_never_give_up() -> None:
    """Killed each time right after it reports SERVING: restarted every time, with delays that
    double up to the cap; a replica that served is never given up on."""
    code, world, supervisor, _, _ = supervise(
        STACK, {"decoder-2": [Life(serves_after=0.5, exits_after=1.0, code=-9)]}, stop_at=100
    )
    assert code == 0 and not supervisor.given_up
    starts = world.starts["decoder-2"]
    gaps = [b - a - 1.0 for a, b in zip(starts, starts[1:])]  # minus the second it lived
    expected = [min(POLICY.initial_delay_s * 2**k, POLICY.max_delay_s) for k in range(len(gaps))]
    assert len(gaps) >= 5
    assert gaps == pytest.approx(expected, abs=Supervisor.TICK_S * 2)


def test_a_stack_that_never_serves_times_out() -> None:
    with pytest.raises(TimeoutError, match="not serving after 30 s: decoder"):
        supervise(STACK, {"decoder": [Life(serves_after=None)]}, timeout=30)
