"""Where the kernels package keeps what it builds and measures: the compiled GEMV and the
kernel-choice tables (``$QWEN3TTS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/qwen3-tts/kernels``,
else ``~/.cache/qwen3-tts/kernels``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "QWEN3TTS_KERNEL_CACHE"


def cache_dir() -> Path:
    """The directory (created on write, not here)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwen3-tts" / "kernels"


__all__ = ["CACHE_ENV", "cache_dir"]
