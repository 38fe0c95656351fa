"""Codec codes <-> the ``Codes`` protobuf message (frames x codebooks, row-major int32)."""

from __future__ import annotations

import numpy as np

from .errors import InvalidRequestError
from .pb.qwen3tts.internal.v1 import stages_pb2


def codes_to_proto(codes: np.ndarray | list[list[int]]) -> stages_pb2.Codes:
    """[frames, codebooks] integer codes -> ``Codes``."""
    arr = np.asarray(codes, dtype=np.int64)
    if arr.ndim != 2:
        raise ValueError(f"codes must be 2-D [frames, codebooks], got shape {arr.shape}")
    return stages_pb2.Codes(
        num_frames=arr.shape[0], num_codebooks=arr.shape[1], values=arr.reshape(-1).tolist()
    )


def codes_from_proto(msg: stages_pb2.Codes) -> np.ndarray:
    """``Codes`` -> int64 array [frames, codebooks]; InvalidRequestError if inconsistent."""
    n, g = int(msg.num_frames), int(msg.num_codebooks)
    values = np.asarray(msg.values, dtype=np.int64)
    if n < 0 or g < 0 or values.size != n * g:
        raise InvalidRequestError(f"Codes message holds {values.size} values, expected {n} x {g}")
    return values.reshape(n, g)
