"""scripts/container_engine.sh where no engine can be had: `start` exits 3 with the reason (the
compose check then skips, saying it), prints nothing to export, and `stop` has nothing to stop.
(The engine itself is exercised by `make compose-test`.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.engine import ENGINE_SCRIPT, NO_ENGINE, NoEngineError, start_engine


@pytest.fixture()
def without_root_or_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment where ``id -u`` is not 0 and no ``docker`` is on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_id = bin_dir / "id"
    fake_id.write_text('#!/bin/sh\nif [ "$1" = -u ]; then echo 1000; else exec /usr/bin/id "$@"; fi\n')
    fake_id.chmod(0o755)
    path = [bin_dir, *(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "docker").exists())]
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, path)))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    return tmp_path / "state"


def test_no_engine_is_exit_3_with_the_reason(without_root_or_docker: Path) -> None:
    result = subprocess.run(
        ["bash", str(ENGINE_SCRIPT), "start", str(without_root_or_docker)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == NO_ENGINE, result.stderr
    assert result.stdout == ""
    assert "root" in result.stderr.strip().splitlines()[-1]
    with pytest.raises(NoEngineError, match="root"):
        start_engine(without_root_or_docker)
    stop = subprocess.run(["bash", str(ENGINE_SCRIPT), "stop", str(without_root_or_docker)], timeout=60)
    assert stop.returncode == 0
