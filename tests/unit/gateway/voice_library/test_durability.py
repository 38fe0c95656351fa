"""Killing the database mid-registration loses no acknowledged voice, and every registration
that was not acknowledged reports VoiceStoreUnavailableError (in time, never a hang).

PostgreSQL: a throwaway server of the test's own (initdb into a temporary directory, a free port)
crashed with an immediate shutdown while four writers register voices, then started again (crash
recovery). SQLite has no server to kill: the process writing the file is SIGKILLed mid-stream
instead, and every voice it had printed as acknowledged must be in the file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.voice_library import VoiceLibraryConfig, VoiceStoreUnavailableError, create_voice_library
from tests.helpers.crash import register_across_a_crash
from tests.helpers.fake_stages import run
from tests.helpers.postgres import ThrowawayPostgres, throwaway_unavailable

from .test_library import ADMIN, ALICE, make_voice

WRITERS = 4
TIMEOUT_S = 2.0


def test_postgres_crash_mid_registration_loses_no_acknowledged_voice() -> None:
    reason = throwaway_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = ThrowawayPostgres()
    try:
        server.start()
        run(registrations_across_a_crash(server), timeout=90)
    finally:
        server.remove()


async def registrations_across_a_crash(server: ThrowawayPostgres) -> None:
    library = create_voice_library(server.url, VoiceLibraryConfig(timeout_s=TIMEOUT_S, pool_size=WRITERS))

    async def register(seed: int) -> tuple[str, bytes]:
        record = await library.add(make_voice(seed), ALICE)
        return record.voice_id, record.speaker_embedding.tobytes()

    try:
        await library.start()
        report = await register_across_a_crash(
            server, register, VoiceStoreUnavailableError, writers=WRITERS, timeout_s=TIMEOUT_S
        )
        acknowledged = report.acknowledged
        assert len(report.failures) == WRITERS  # each writer's registration after the crash reported an error
        assert report.in_flight_at_crash > 0
        # after recovery: every acknowledged voice is there, bit for bit, through the same library
        await asyncio.to_thread(server.start)
        stored = {info.voice_id async for info in library.iter_voices(ADMIN)}
        missing = set(acknowledged) - stored
        assert not missing, f"{len(missing)} acknowledged voice(s) lost"
        for voice_id, embedding in list(acknowledged.items())[:5]:
            assert (await library.get(voice_id, ALICE)).speaker_embedding.tobytes() == embedding
        # registrations that were in flight may or may not have committed (the answer was lost),
        # but nothing else is there
        assert len(stored - set(acknowledged)) <= report.in_flight_at_crash
    finally:
        await library.close()


WRITER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from gateway.voice_library import create_voice_library
    from tests.unit.gateway.voice_library.test_library import ALICE, make_voice

    async def main():
        async with create_voice_library(sys.argv[1]) as library:
            seed = 0
            while True:
                seed += 1
                record = await library.add(make_voice(seed), ALICE)
                print(record.voice_id, flush=True)  # acknowledged

    asyncio.run(main())
    """
)


def test_sqlite_writer_killed_mid_registration_loses_no_acknowledged_voice(tmp_path: Path) -> None:
    database = tmp_path / "voices.db"
    repo = Path(__file__).resolve().parents[4]
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(database)],
        stdout=subprocess.PIPE,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        text=True,
    )
    acknowledged: list[str] = []
    try:
        assert child.stdout is not None
        while len(acknowledged) < 30:
            line = child.stdout.readline()
            assert line, f"the writer exited ({child.wait()})"
            acknowledged.append(line.strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            acknowledged += [line.strip() for line in child.stdout.read().splitlines() if line.strip()]

    async def main() -> None:
        async with create_voice_library(database) as library:
            stored = {info.voice_id async for info in library.iter_voices(ADMIN)}
        assert set(acknowledged) <= stored
        assert len(stored) - len(acknowledged) <= 1  # at most the one being written when killed

    run(main())
