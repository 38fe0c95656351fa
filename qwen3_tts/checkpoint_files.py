"""How the dev checkpoints (:mod:`qwen3_tts.dev_model`, :mod:`qwen3_tts.dev_aligner`) land in
their folder: written into a staging folder inside it, then moved into place file by file with
``config.json`` last.

The folder may be a volume's mount point (the image's ``/models/checkpoint``,
``/models/aligner``), which can be filled but never removed or renamed over (EBUSY), and a folder
without ``config.json`` reads as no checkpoint (``--if-missing``, the image's entrypoint), so an
interrupted write is redone, never loaded. Standard library only: :mod:`qwen3_tts.dev_aligner`
is also imported by path in the official package's environment, where this project is not
installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "config.json"
"""The file whose presence makes a folder a checkpoint; written last."""


def write_checkpoint(
    path: str | Path, write: Callable[[Path], None], *, staging_prefix: str, if_missing: bool = False
) -> Path:
    """``write(folder)`` fills an empty staging folder inside ``path`` (created) with every file
    of a checkpoint; they replace those in ``path`` (:data:`MARKER` last). ``if_missing``: leave
    an existing checkpoint (a :data:`MARKER` in ``path``) untouched. Returns ``path``."""
    root = Path(path)
    if if_missing and (root / MARKER).is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix, dir=root))
    try:
        write(staging)
        (root / MARKER).unlink(missing_ok=True)  # incomplete until the new one lands
        move_files_into(staging, root, last=MARKER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def move_files_into(source: Path, target: Path, last: str) -> None:
    """Move every file under ``source`` to the same relative path under ``target`` (each an
    atomic rename on one filesystem, replacing what is there), ``source/last`` after all others.
    Each is made readable by everyone first (safetensors writes 0600), so that a checkpoint made
    by one user loads in processes of another (the image runs as uid 10001)."""
    files = sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: p == source / last)
    for file in files:
        destination = target / file.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        file.chmod(0o644)
        os.replace(file, destination)


__all__ = ["MARKER", "move_files_into", "write_checkpoint"]
