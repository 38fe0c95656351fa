"""How streamed audio is cut into chunks: sizes in codec frames (80 ms each), small first for a
low time to first audio, then growing (x :data:`CHUNK_GROWTH`) up to a largest size that amortises
per-chunk overhead. One definition for the gateway (request defaults) and the decoder (its
schedule; paced, it sends a chunk before it is full where a listener would otherwise run out of audio:
``decoder_service/pacing.py``)."""

from __future__ import annotations

from tts_common.errors import InvalidRequestError

DEFAULT_FIRST_CHUNK_FRAMES = 2
"""160 ms: the first audio leaves after two frames."""
DEFAULT_MAX_CHUNK_FRAMES = 25
"""2 s: large enough that per-chunk costs vanish, small enough for smooth progress."""
MAX_CHUNK_FRAMES = 100
"""Largest accepted chunk size (8 s of audio)."""
CHUNK_GROWTH = 2.0
"""Each chunk is this many times the previous one until the largest size."""


def resolve_chunking(
    first: int,
    largest: int,
    *,
    default_first: int = DEFAULT_FIRST_CHUNK_FRAMES,
    default_max: int = DEFAULT_MAX_CHUNK_FRAMES,
    field_prefix: str = "streaming.",
) -> tuple[int, int]:
    """``(first_chunk_frames, max_chunk_frames)`` with 0 -> the defaults. A single explicit value
    that contradicts the other default moves that default along; two contradicting explicit values
    are refused (INVALID_ARGUMENT naming the fields)."""
    for name, value in (("first_chunk_frames", first), ("max_chunk_frames", largest)):
        if not 0 <= value <= MAX_CHUNK_FRAMES:
            raise InvalidRequestError(
                f"{field_prefix}{name} must be in [0, {MAX_CHUNK_FRAMES}] (0 = server default), got {value}"
            )
    resolved_first = first or default_first
    resolved_max = largest or default_max
    if resolved_max < resolved_first:
        if first and largest:
            raise InvalidRequestError(
                f"{field_prefix}max_chunk_frames ({resolved_max}) must be >= "
                f"{field_prefix}first_chunk_frames ({resolved_first})"
            )
        if largest:
            resolved_first = resolved_max
        else:
            resolved_max = resolved_first
    return resolved_first, resolved_max
