"""Registrations across a database crash: writers register voices one after another until the
database (a :class:`~tests.helpers.postgres.ThrowawayPostgres`) is crashed under them; each then
ends with its first failure. What the durability tests check is what came back: the acknowledged
voices, the failures and how many registrations were in flight at the crash."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.helpers.postgres import ThrowawayPostgres


@dataclass
class CrashReport:
    acknowledged: dict[str, bytes] = field(default_factory=dict)
    """Voice id -> the embedding's bytes, of every registration that was acknowledged."""
    failures: list[BaseException] = field(default_factory=list)
    """The failure that ended each writer (all after the crash)."""
    in_flight_at_crash: int = 0


async def register_across_a_crash(
    server: ThrowawayPostgres,
    register: Callable[[int], Awaitable[tuple[str, bytes]]],
    failure: type[BaseException],
    *,
    writers: int,
    timeout_s: float,
    before_crash: int = 40,
) -> CrashReport:
    """Run ``writers`` writers of ``register(seed)`` (-> the voice id and its embedding's bytes),
    crash ``server`` once ``before_crash`` were acknowledged, and wait for every writer to end
    with a ``failure`` (any other exception fails the caller's test; a registration may take at
    most ``timeout_s`` + 5 s: a hang guard)."""
    report = CrashReport()
    crashed = asyncio.Event()
    in_flight = 0

    async def writer(worker: int) -> None:
        nonlocal in_flight
        seed = worker * 10_000
        while True:
            seed += 1
            in_flight += 1
            started = time.monotonic()
            try:
                voice_id, embedding = await register(seed)
            except failure as exc:
                assert time.monotonic() - started < timeout_s + 5.0  # hang guard
                assert crashed.is_set(), f"failed before the crash: {exc}"
                report.failures.append(exc)
                return
            finally:
                in_flight -= 1
            report.acknowledged[voice_id] = embedding

    tasks = [asyncio.create_task(writer(i)) for i in range(writers)]
    while len(report.acknowledged) < before_crash:
        await asyncio.sleep(0.01)
    report.in_flight_at_crash = in_flight
    crashed.set()
    await asyncio.to_thread(server.crash)
    await asyncio.gather(*tasks)
    return report


__all__ = ["CrashReport", "register_across_a_crash"]
