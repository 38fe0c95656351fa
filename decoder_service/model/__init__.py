"""Speech-tokenizer decoder models: whole-utterance and seamless streaming decoding.

Public API for the decoder service:

* :class:`CodecDecoder` — ``CodecDecoder.from_checkpoint(path, device, dtype)``; ``decode`` (exact,
  one pass), ``decode_official_chunked`` (the official 300/25 chunked decode), ``decode_utterances``
  (official batch semantics incl. the voice-clone ICL cut).
* :class:`DecoderSession` — per-utterance streaming state, optional ``prefix_codes`` left context.
* :func:`advance_sessions` / :class:`SessionBatcher` — advance many sessions with one forward.
* :class:`ChunkSchedule` — growing chunk sizes (small first chunk for low latency).
"""

from .codec_decoder import CodecDecoder, icl_cut, init_random_weights
from .streaming import ChunkSchedule, DecoderSession, SessionBatcher, advance_sessions

__all__ = [
    "ChunkSchedule",
    "CodecDecoder",
    "DecoderSession",
    "SessionBatcher",
    "advance_sessions",
    "icl_cut",
    "init_random_weights",
]
