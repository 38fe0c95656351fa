"""Shared fixtures of the aligner tests: the official fixtures' cases and, where the official
aligner environment exists, a live oracle (``scripts/aligner_text_fixtures.py --serve`` run by its
Python) that hypothesis tests query."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "aligner"
# The Python of a virtual environment holding the official package (qwen-asr==0.0.6 beside CPU
# torch 2.13.0); unset, the live-oracle tests skip and the committed fixtures still run.
ORACLE_PYTHON = os.environ.get("QWEN3TTS_ALIGNER_ORACLE_PYTHON", "")


def load_cases(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, cases) of a fixture file written by scripts/aligner_text_fixtures.py."""
    payload = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return payload["meta"], payload["cases"]


class Oracle:
    """The official processor in its own environment, one JSON line per question."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, str(ROOT / "scripts" / "aligner_text_fixtures.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the official oracle exited")
        return json.loads(line)

    def words(self, text: str, language: str) -> list[str]:
        return self.ask({"words": text, "language": language})["words"]

    def repair(self, values: list[float]) -> list[int]:
        return self.ask({"repair": values})["repaired"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def official_oracle() -> Iterator[Oracle]:
    if not ORACLE_PYTHON or not Path(ORACLE_PYTHON).exists():
        pytest.skip(
            f"no official aligner environment (QWEN3TTS_ALIGNER_ORACLE_PYTHON={ORACLE_PYTHON!r}); "
            "the recorded fixtures cover the same rules"
        )
    oracle = Oracle(ORACLE_PYTHON)
    try:
        oracle.words("warm up", "english")
        yield oracle
    finally:
        oracle.close()
