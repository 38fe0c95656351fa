"""Where the kernels package keeps what it builds and measures: the compiled GEMV, the
kernel-choice tables and the ``--dtype auto`` timings (:mod:`tts_common.auto_dtype`), in
``$QWEN3TTS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/qwen3-tts/kernels``, else
``~/.cache/qwen3-tts/kernels``."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

CACHE_ENV = "QWEN3TTS_KERNEL_CACHE"


def cache_dir() -> Path:
    """The directory (created on write, not here)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwen3-tts" / "kernels"


def machine_cache_file(kind: str) -> Path:
    """The cache file of ``kind`` for this CPU (model name, generation and flags:
    :func:`~tts_common.cpu_info.cpu_identity`) and torch version: what it measures holds for
    both, and a cache shared by hosts of one model name but another generation must not hand
    one the other's choice."""
    import torch

    from tts_common.cpu_info import cpu_identity

    slug = re.sub(r"[^A-Za-z0-9]+", "-", cpu_identity()).strip("-") or "unknown"
    return cache_dir() / f"{kind}-{slug}-torch{torch.__version__}.json"


def load_json(path: Path) -> dict:
    """A cache file's object; empty where the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def store_json(path: Path, data: dict) -> None:
    """Write a cache file atomically (a concurrent reader sees the old file or the new); a cache
    that cannot be written is logged, never an error (it only costs a measurement next start)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except OSError as e:
        logging.getLogger(__name__).warning("not cached (%s): %s", path, e)


__all__ = ["CACHE_ENV", "cache_dir", "load_json", "machine_cache_file", "store_json"]
