"""Speech-tokenizer decoder models: whole-utterance and seamless streaming decoding.

Public API for the decoder service:

* :func:`load_codec_decoder` — ``load_codec_decoder(path, device, dtype)``: the decoder of a
  checkpoint (strict loading).
* :class:`CodecDecoder` — ``decode`` (exact, one pass), ``decode_official_chunked`` (the official
  300/25 chunked decode), ``decode_utterances`` (official batch semantics incl. the voice-clone
  ICL cut, :func:`icl_cut`).
* :class:`DecoderSession` — per-utterance streaming state, optional ``prefix_codes`` left context.
* :func:`advance_sessions` / :class:`SessionBatcher` — advance many sessions with one forward.
* :class:`ChunkSchedule` — growing chunk sizes (small first chunk for low latency).
* :func:`init_random_weights` — dev only (tests, benchmarks): random weights, never for serving.

Modules: ``decoder`` (the model), ``loading``, ``random_init``, ``streaming``, ``cuda_graphs``;
building blocks in ``primitives``, ``convolutions``, ``quantizer``, ``transformer``.
"""

from .decoder import CodecDecoder, icl_cut
from .loading import load_codec_decoder
from .random_init import init_random_weights
from .streaming import ChunkSchedule, DecoderSession, SessionBatcher, advance_sessions

__all__ = [
    "ChunkSchedule",
    "CodecDecoder",
    "DecoderSession",
    "SessionBatcher",
    "advance_sessions",
    "icl_cut",
    "init_random_weights",
    "load_codec_decoder",
]
