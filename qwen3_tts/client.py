"""``qwen3-tts say``: a small streaming client of the gateway's ``Synthesize``."""

from __future__ import annotations

import argparse
import sys
import time

import grpc
import numpy as np
import soundfile as sf

from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc


def build_request(args: argparse.Namespace) -> tts_pb2.SynthesizeRequest:
    sampling = tts_pb2.SamplingOptions()
    if args.greedy:
        sampling.do_sample = False
        sampling.subtalker_do_sample = False
    if args.seed is not None:
        sampling.seed = args.seed
    if args.max_new_tokens is not None:
        sampling.max_new_tokens = args.max_new_tokens
    req = tts_pb2.SynthesizeRequest(
        text=args.text,
        language=args.language,
        instruct=args.instruct or "",
        sampling=sampling,
        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
    )
    if args.speaker:
        req.speaker = args.speaker
    elif args.voice_id:
        req.voice_id = args.voice_id
    elif args.ref_audio:
        req.clone.ref_audio = args.ref_audio.read_bytes()
        req.clone.ref_audio_encoding = tts_pb2.REFERENCE_AUDIO_ENCODING_FILE
        req.clone.ref_text = args.ref_text or ""
        req.clone.x_vector_only = args.x_vector_only
    return req


def say(args: argparse.Namespace) -> int:
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    t0 = time.monotonic()
    pieces: list[np.ndarray] = []
    sample_rate = 24000
    summary = None
    with grpc.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        try:
            for response in stub.Synthesize(build_request(args), timeout=args.timeout, metadata=metadata):
                kind = response.WhichOneof("payload")
                if kind == "metadata":
                    sample_rate = response.metadata.sample_rate or sample_rate
                elif kind == "audio":
                    pieces.append(np.frombuffer(response.audio.data, dtype="<f4"))
                    seconds = sum(len(p) for p in pieces) / sample_rate
                    if len(pieces) == 1:
                        print(f"first audio after {1000 * (time.monotonic() - t0):.0f} ms", file=sys.stderr)
                    print(
                        f"\r{len(pieces)} chunks, {seconds:.2f} s of audio",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
                elif kind == "summary":
                    summary = response.summary
        except grpc.RpcError as exc:
            print(f"\nerror: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    sf.write(args.out, audio, sample_rate, subtype="FLOAT")
    print(file=sys.stderr)
    if summary is not None:
        print(
            f"{args.out}: {summary.audio_seconds:.2f} s audio, {summary.frames} frames, first audio "
            f"{summary.time_to_first_audio_ms:.0f} ms, RTF {summary.rtf:.2f} "
            f"({tts_pb2.FinishReason.Name(summary.finish_reason)})"
        )
    return 0
