"""``qwen3-tts say``: a small streaming client of the gateway's ``Synthesize``, or with
``--stream-text`` of ``StreamingSynthesize``: standard input is sent as it arrives (pipe the
output of a program that writes text progressively into it). With ``--captions out.srt|out.vtt``
it asks for word timestamps and writes them as captions beside the audio."""

from __future__ import annotations

import argparse
import codecs
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import grpc
import numpy as np
import soundfile as sf

from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

from .captions import TimedWord, write_captions
from .request_flags import request_from_flags

STDIN_READ_BYTES = 4096


def build_request(args: argparse.Namespace) -> tts_pb2.SynthesizeRequest:
    """The Synthesize request of ``args`` (with ``--stream-text``: the configuration, no text),
    float32 audio."""
    text = "" if args.stream_text else args.text
    request = request_from_flags(args, text=text, encoding=tts_pb2.AUDIO_ENCODING_FLOAT32)
    if getattr(args, "captions", None) is not None:
        request.timestamps = tts_pb2.TIMESTAMP_UNIT_WORD
    return request


def timed_words(message: tts_pb2.Timestamps, sample_rate: int) -> list[TimedWord]:
    """The units of a ``timestamps`` response, in seconds of the audio as sent."""
    return [
        TimedWord(u.text, u.start_sample / sample_rate, u.end_sample / sample_rate, u.char_start, u.char_end)
        for u in message.units
    ]


class TextRecorder:
    """Passes text deltas through and keeps them: the streamed text the units' character spans
    index (StreamingSynthesize's spans are over the concatenated deltas)."""

    def __init__(self, deltas: Iterable[str]) -> None:
        self._deltas = deltas
        self.parts: list[str] = []

    def __iter__(self) -> Iterator[str]:
        for delta in self._deltas:
            self.parts.append(delta)
            yield delta

    @property
    def text(self) -> str:
        return "".join(self.parts)


def text_deltas(stream: BinaryIO, read_bytes: int = STDIN_READ_BYTES) -> Iterator[str]:
    """The text of ``stream`` as it arrives: whatever each read returns (a pipe's read returns as
    soon as anything was written), decoded as UTF-8 without splitting a character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = stream.fileno()
    while data := os.read(fd, read_bytes):
        if text := decoder.decode(data):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


def streaming_messages(
    config: tts_pb2.SynthesizeRequest, deltas: Iterable[str]
) -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
    """StreamingSynthesize's client messages: the configuration, then one per delta."""
    yield tts_pb2.StreamingSynthesizeRequest(config=config)
    for delta in deltas:
        yield tts_pb2.StreamingSynthesizeRequest(text=delta)


def say(args: argparse.Namespace) -> int:
    """Run ``qwen3-tts say``: write the audio to ``args.out``; 1 on an RPC error."""
    if not args.stream_text and not args.text:
        print("error: give the text, or --stream-text to read it from standard input", file=sys.stderr)
        return 2
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    t0 = time.monotonic()
    pieces: list[np.ndarray] = []
    sample_rate = 24000
    summary = None
    words: list[TimedWord] = []
    timing_errors: list[str] = []
    streamed = TextRecorder(text_deltas(sys.stdin.buffer)) if args.stream_text else None
    with grpc.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        if streamed is not None:
            messages = streaming_messages(build_request(args), streamed)
            responses = stub.StreamingSynthesize(messages, timeout=args.timeout, metadata=metadata)
        else:
            responses = stub.Synthesize(build_request(args), timeout=args.timeout, metadata=metadata)
        try:
            for response in responses:
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
                elif kind == "timestamps":
                    words += timed_words(response.timestamps, sample_rate)
                    if response.timestamps.error:
                        timing_errors.append(
                            f"utterance {response.timestamps.index}: {response.timestamps.error}"
                        )
                elif kind == "summary":
                    summary = response.summary
        except grpc.RpcError as exc:
            print(f"\nerror: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    sf.write(args.out, audio, sample_rate, subtype="FLOAT")
    print(file=sys.stderr)
    if args.captions is not None:
        text = streamed.text if streamed is not None else args.text
        # utterances are aligned concurrently: their messages may arrive out of order
        cues = write_captions(args.captions, sorted(words, key=lambda w: (w.start, w.char_start)), text)
        print(f"{args.captions}: {len(words)} words in {len(cues)} captions", file=sys.stderr)
        for error in timing_errors:
            print(f"warning: no timings for {error}", file=sys.stderr)
    if summary is not None:
        waited = f", talker waited {summary.text_wait_ms:.0f} ms for text" if args.stream_text else ""
        print(
            f"{args.out}: {summary.audio_seconds:.2f} s audio, {summary.frames} frames, first audio "
            f"{summary.time_to_first_audio_ms:.0f} ms, RTF {summary.rtf:.2f} "
            f"({tts_pb2.FinishReason.Name(summary.finish_reason)}){waited}"
        )
    return 0
