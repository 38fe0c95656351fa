"""The fingerprint of a checkpoint's speech tokenizer: which codec its codes are in.

Every released Qwen3-TTS checkpoint ships the same 12 Hz speech tokenizer
(``speech_tokenizer/``), so one decoder pool can serve all of a gateway's talker models. The
gateway checks that at startup by comparing the fingerprints its talkers and decoders report
(``TalkerInfo.speech_tokenizer``, ``DecoderInfo.speech_tokenizer``).

The fingerprint is a SHA-256 over what decides the codec and nothing else:

* ``speech_tokenizer/config.json``, parsed and written canonically (sorted keys), without the
  keys that only say how a file was saved (:data:`IGNORED_CONFIG_KEYS`);
* every tensor of ``speech_tokenizer/model.safetensors``: its name, dtype, shape and bytes, in
  name order (the file's metadata header and tensor order do not count, so a re-saved copy of the
  same weights has the same fingerprint).

Hashing reads the weights once (about 0.7 GB for a release: well under a second from the page
cache); results are cached per file (path, size, modification time).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import struct
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

IGNORED_CONFIG_KEYS = frozenset({"dtype", "torch_dtype", "transformers_version", "_name_or_path"})
"""``config.json`` keys that describe the saved file, not the codec."""

_READ_BYTES = 1 << 20


def _canonical_config(path: Path) -> bytes:
    with open(path, encoding="utf-8") as fh:
        config: dict[str, Any] = json.load(fh)
    kept = {k: v for k, v in config.items() if k not in IGNORED_CONFIG_KEYS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()


def _hash_tensors(path: Path, digest: Any) -> None:
    """Feed ``digest`` every tensor of a safetensors file (name, dtype, shape, bytes) by name."""
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(header_len))
        base = 8 + header_len
        for name in sorted(k for k in header if k != "__metadata__"):
            entry = header[name]
            begin, end = entry["data_offsets"]
            digest.update(json.dumps([name, entry["dtype"], entry["shape"]]).encode())
            fh.seek(base + begin)
            remaining = end - begin
            while remaining > 0:
                block = fh.read(min(_READ_BYTES, remaining))
                if not block:
                    raise ValueError(f"{path}: tensor {name} is truncated")
                digest.update(block)
                remaining -= len(block)


@functools.lru_cache(maxsize=16)
def _fingerprint(config: Path, weights: Path, stamp: tuple[int, int, int, int]) -> str:
    digest = hashlib.sha256(b"qwen3-tts speech tokenizer v1\0")
    digest.update(_canonical_config(config))
    _hash_tensors(weights, digest)
    return digest.hexdigest()


def speech_tokenizer_fingerprint(checkpoint: str | Path) -> str:
    """The fingerprint of ``checkpoint``'s ``speech_tokenizer/`` (see the module doc);
    FileNotFoundError if it has none."""
    root = Path(checkpoint).resolve() / "speech_tokenizer"
    config, weights = root / "config.json", root / "model.safetensors"
    c, w = config.stat(), weights.stat()
    return _fingerprint(config, weights, (c.st_size, c.st_mtime_ns, w.st_size, w.st_mtime_ns))


def reported_fingerprint(checkpoint: str | Path) -> str:
    """What a stage reports (``TalkerInfo`` / ``DecoderInfo.speech_tokenizer``): the
    fingerprint, or "" (logged) when the files cannot be read, so that a stage serving from an
    incomplete checkpoint still starts; the gateway then skips its check for that stage."""
    try:
        return speech_tokenizer_fingerprint(checkpoint)
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("no speech tokenizer fingerprint for %s: %s", checkpoint, exc)
        return ""


def short_fingerprint(fingerprint: str) -> str:
    """The first 12 hex digits, for messages and logs."""
    return fingerprint[:12] or "(none)"


__all__ = ["IGNORED_CONFIG_KEYS", "reported_fingerprint", "short_fingerprint", "speech_tokenizer_fingerprint"]
