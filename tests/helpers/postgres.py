"""PostgreSQL for tests: the machine's shared server (:func:`shared_postgres_url`, each test in a
schema of its own) and a throwaway server a test may kill (:class:`ThrowawayPostgres`).

The shared server is 127.0.0.1:5432 (trust auth, database ``test``) unless
``QWEN3TTS_TEST_POSTGRES_URL`` says otherwise; CI uses it too, so tests never stop or reconfigure
it. The throwaway server is initdb'd into a temporary directory from the PostgreSQL binaries on
the machine (``/usr/lib/postgresql/*/bin``), run as the ``postgres`` user when the tests run as
root (the server refuses root), on a free port, and deleted afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.helpers.stack import free_port

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def shared_postgres_url() -> str:
    return os.environ.get("QWEN3TTS_TEST_POSTGRES_URL", DEFAULT_URL)


@functools.cache
def shared_postgres_unreachable() -> str | None:
    """Why the shared server cannot be used (None when it answers)."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed"
    url = shared_postgres_url()

    async def probe() -> None:
        conn = await asyncpg.connect(url, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # noqa: BLE001  # any failure means: skip, saying why
        return f"no PostgreSQL server at {url}: {type(exc).__name__}: {exc}"
    return None


def new_schema_name() -> str:
    return f"test_{uuid.uuid4().hex[:16]}"


async def drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def throwaway_unavailable() -> str | None:
    """Why a throwaway server cannot be run here (None when it can)."""
    bin_dir = _bin_dir()
    if bin_dir is None or not (bin_dir / "pg_ctl").exists():
        return "no PostgreSQL server binaries (initdb, pg_ctl) on this machine"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run a server as"
        if shutil.which("runuser") is None:
            return "running as root without runuser (util-linux) to run a server as 'postgres'"
    return None


class ThrowawayPostgres:
    """A PostgreSQL server of the test's own: :meth:`start`, :meth:`crash` (immediate shutdown:
    no checkpoint, like a killed server), :meth:`start` again (crash recovery), :meth:`remove`."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None
        self._bin = bin_dir
        self._root = Path(tempfile.mkdtemp(prefix="qwen3tts-pg-"))
        self.data = self._root / "data"
        self.port = free_port()
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            entry = pwd.getpwnam("postgres")
            os.chown(self._root, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "--no-instructions"
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        # As another user through runuser rather than subprocess's user=: that makes Python fork
        # (not vfork), which runs gRPC's fork handlers, and a child forked beside a busy
        # in-process gRPC server (a test's gateway) can crash before it execs.
        switch = ["runuser", "-u", self._user, "--"] if self._user else []
        subprocess.run(
            [*switch, str(self._bin / tool), *args],
            check=True,
            capture_output=True,
            timeout=60,
            cwd=self._root,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self._root} -c listen_addresses=127.0.0.1 -c max_connections=40"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self._root / "log"), "-o", options, "-w", "start")

    def crash(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def remove(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self._root, ignore_errors=True)


__all__ = [
    "ThrowawayPostgres",
    "drop_schema",
    "new_schema_name",
    "shared_postgres_unreachable",
    "shared_postgres_url",
    "throwaway_unavailable",
]
