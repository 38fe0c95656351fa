"""Voices for tests: the files of a legacy ``--voices-dir`` exactly as gateways before the voice
library wrote them (one JSON file per voice; ``family`` and ``design`` since several models
behind one gateway), and the fake speaker's embedding of an audio (what a registration stores)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from tests.helpers.fake_stages import EMBEDDING_DIM


def fake_embedding(audio: bytes) -> np.ndarray:
    """What the fake speaker stage makes of ``audio`` (float32, as the library keeps it)."""
    digest = hashlib.sha256(audio).digest()
    return np.array([b / 255.0 for b in digest[:EMBEDDING_DIM]], dtype=np.float32)


def write_legacy_voice(
    directory: Path,
    seed: int,
    *,
    x_vector_only: bool = False,
    dim: int = 16,
    num_codebooks: int = 16,
    family: str | None = None,
    design: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``voice-<seed as 32 hex digits>.json`` into ``directory``: a legacy voice file
    (``family`` None: the form from before model families, without the key). Returns its
    JSON."""
    rng = np.random.default_rng(seed)
    created = Timestamp()
    created.FromNanoseconds(1_700_000_000_123_456_789 + seed)
    data: dict[str, Any] = {
        "format_version": 1,
        "voice_id": f"voice-{seed:032x}",
        "name": f"legacy {seed}",
        "x_vector_only": x_vector_only,
        "ref_text": "" if x_vector_only else "legacy words",
        "ref_audio_seconds": 2.5,
        "created_at": created.ToJsonString(),
        "model_name": "Qwen3-TTS-12Hz-0.6B-Base",
        "audio_sha256": "ab" * 32,
        "speaker_embedding": rng.standard_normal(dim).astype(np.float32).tolist(),
        "ref_codes": None
        if x_vector_only
        else {
            "num_frames": 3,
            "num_codebooks": num_codebooks,
            "values": rng.integers(0, 2048, 3 * num_codebooks).tolist(),
        },
    }
    if family is not None:
        data["family"] = family
    if design is not None:
        data["design"] = design
    (directory / f"{data['voice_id']}.json").write_text(json.dumps(data), encoding="utf-8")
    return data


__all__ = ["fake_embedding", "write_legacy_voice"]
