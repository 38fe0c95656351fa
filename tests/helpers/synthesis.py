"""What tests feed to and read from the public synthesis API: text cut into deltas, and the
float32 audio of a response stream."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import numpy as np

from tts_common.pb.qwen3tts.v1 import tts_pb2

__all__ = ["chunks_audio", "cut", "responses_audio"]


def cut(text: str, points: Iterable[int]) -> list[str]:
    """``text`` cut at ``points`` (each in ``0..len(text)``, any order): one piece more than
    points, joining back to ``text``; a point at either end, or given twice, makes an empty piece."""
    bounds = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in pairwise(bounds)]


def chunks_audio(chunks: Iterable[tts_pb2.AudioChunk]) -> np.ndarray:
    """The samples of AUDIO_ENCODING_FLOAT32 ``chunks``, joined."""
    return np.frombuffer(b"".join(c.data for c in chunks), "<f4")


def responses_audio(responses: Iterable[tts_pb2.SynthesizeResponse]) -> np.ndarray:
    """The samples of the audio chunks among ``responses`` (AUDIO_ENCODING_FLOAT32), joined."""
    return chunks_audio(r.audio for r in responses if r.HasField("audio"))
