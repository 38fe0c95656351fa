"""The command-line flags of a synthesis request, turned into a ``SynthesizeRequest`` in one place:
``qwen3-tts say`` and the benches that call a running gateway (``bench/long_text.py``,
``bench/stream_text.py``, ``bench/load.py``) add them with :func:`add_request_flags` and build
their requests with :func:`request_from_flags`, so a flag has one spelling and one meaning
everywhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tts_common.pb.qwen3tts.v1 import tts_pb2


def add_request_flags(
    parser: argparse.ArgumentParser,
    *,
    language: str = "auto",
    seed: int | None = None,
    max_new_tokens: int | None = None,
    cloning: bool = True,
    greedy: bool = True,
) -> None:
    """Add the request flags to ``parser`` (``language``, ``seed``, ``max_new_tokens``: their
    defaults; ``cloning``: the voice-clone flags too; ``greedy``: the ``--greedy`` switch)."""
    group = parser.add_argument_group("request")
    group.add_argument(
        "--model", default="", help="a served model (ListModels; default: the gateway's default)"
    )
    group.add_argument("--speaker", help="preset speaker (custom_voice models)")
    group.add_argument("--language", default=language, help=f"language name or auto (default {language})")
    group.add_argument(
        "--instruct", help="voice description (voice_design models) or style (1.7B custom_voice)"
    )
    group.add_argument("--voice-id", help="a registered voice (base models)")
    if cloning:
        group.add_argument("--ref-audio", type=Path, help="reference recording to clone (base models)")
        group.add_argument("--ref-text", help="transcript of --ref-audio")
        group.add_argument("--x-vector-only", action="store_true", help="clone from the x-vector alone")
    if greedy:
        group.add_argument("--greedy", action="store_true", help="greedy talker and code predictor")
    group.add_argument("--seed", type=int, default=seed, help="sampling seed (default: the server picks one)")
    group.add_argument(
        "--max-new-tokens",
        type=int,
        default=max_new_tokens,
        help="talker steps per segment (default: the talker's runaway guard)",
    )


def request_from_flags(
    args: argparse.Namespace,
    *,
    text: str = "",
    encoding: int = tts_pb2.AUDIO_ENCODING_PCM16,
    text_feeding: int = tts_pb2.TEXT_FEEDING_DEFAULT,
) -> tts_pb2.SynthesizeRequest:
    """The ``SynthesizeRequest`` of flags added by :func:`add_request_flags` (``text`` empty: a
    StreamingSynthesize configuration)."""
    sampling = tts_pb2.SamplingOptions()
    if getattr(args, "greedy", False):
        sampling.do_sample = False
        sampling.subtalker_do_sample = False
    if args.seed is not None:
        sampling.seed = args.seed
    if args.max_new_tokens is not None:
        sampling.max_new_tokens = args.max_new_tokens
    request = tts_pb2.SynthesizeRequest(
        model=args.model,
        text=text,
        language=args.language,
        instruct=args.instruct or "",
        text_feeding=text_feeding,
        sampling=sampling,
        output=tts_pb2.AudioFormat(encoding=encoding),
    )
    if args.speaker:
        request.speaker = args.speaker
    elif args.voice_id:
        request.voice_id = args.voice_id
    elif getattr(args, "ref_audio", None):
        request.clone.ref_audio = args.ref_audio.read_bytes()
        request.clone.ref_audio_encoding = tts_pb2.REFERENCE_AUDIO_ENCODING_FILE
        request.clone.ref_text = args.ref_text or ""
        request.clone.x_vector_only = args.x_vector_only
    return request


__all__ = ["add_request_flags", "request_from_flags"]
