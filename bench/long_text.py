"""Long-text bench: time to first audio of a 20,000-character text against its first segment
alone, and playback underruns at concurrency 1 (the no-gap goal between segments).

Against a running gateway (e.g. ``qwen3-tts up`` on the dev checkpoint), one request at a time:

1. the long text (a deterministic English chapter of ``--chars`` characters) with a fixed
   seed; its summary names the segments;
2. the first segment's text alone with the same seed (segment 0 keeps the request's seed), so it
   is the same utterance the long request starts with.

Repeated ``--repeats`` times, alternating. Reports the TTFA medians and their ratio (goal: long
<= 1.2 x first segment), and the underruns of both as a real-time player meets them (playback
from the first chunk; a chunk arriving after the audio before it has played out is an underrun,
and playback resumes when it arrives); for the long streams those at a segment's first chunk are
counted separately (a gap between segments).

    python bench/long_text.py --gateway 127.0.0.1:50051 --speaker ryan --json bench/results/long_text.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from playback import Playback, PlayedStream

from qwen3_tts.request_flags import add_request_flags, request_from_flags
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

SENTENCES = (
    "Chapter {n} begins on a quiet morning, when Dr. Lee opened the shutters of the old house.",
    "The thermometer read {n}.5 degrees, e.g. warmer than the day before; nobody complained.",
    "Was it really {n} years since the U.S. office had moved to www.example.com/offices?",
    "She laughed... then she wrote {n} pages, slowly, carefully, and without a single pause!",
    "“Come in,” he said. “The kettle is on, and there are {n} cups on the table.”",
)


def chapter(chars: int) -> str:
    """A deterministic English text of about ``chars`` characters in paragraphs."""
    paragraphs: list[str] = []
    n = 0
    while sum(len(p) + 2 for p in paragraphs) < chars:
        n += 1
        paragraphs.append(" ".join(s.format(n=n) for s in SENTENCES))
    return "\n\n".join(paragraphs)[:chars].rsplit(" ", 1)[0]


@dataclass
class Stream(PlayedStream):
    ttfa_ms: float = 0.0
    total_ms: float = 0.0
    chunks: int = 0
    boundary_underruns: int = 0
    """Underruns at the first chunk of a segment after the first."""
    summary: tts_pb2.SynthesisSummary | None = field(default=None, repr=False)
    chunk_starts: list[int] = field(default_factory=list, repr=False)


def synthesize(
    stub: tts_pb2_grpc.TextToSpeechStub, request: tts_pb2.SynthesizeRequest, deadline: float
) -> Stream:
    """One Synthesize call, timed as a real-time player (playback.Playback) would consume it."""
    res = Stream()
    rate = 24000
    t0 = time.monotonic()
    player = Playback()
    for response in stub.Synthesize(request, timeout=deadline):
        kind = response.WhichOneof("payload")
        now = time.monotonic()
        if kind == "metadata":
            rate = response.metadata.sample_rate or rate
        elif kind == "audio":
            if player.first_at is None:
                res.ttfa_ms = (now - t0) * 1000
            player.chunk(now, response.audio.num_samples / rate)
            res.chunk_starts.append(response.audio.start_sample)
            res.chunks += 1
        else:
            res.summary = response.summary
    res.total_ms = (time.monotonic() - t0) * 1000
    res.heard(player)
    if res.summary is not None:
        boundaries = {s.start_sample for s in res.summary.segments[1:]}
        res.boundary_underruns = sum(
            1 for start, late in zip(res.chunk_starts, res.late_ms) if late > 0 and start in boundaries
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="127.0.0.1:50051")
    add_request_flags(ap, language="english", seed=1234, cloning=False, greedy=False)
    ap.add_argument("--chars", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=3600.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    text = chapter(args.chars)
    base = request_from_flags(args)

    long_runs: list[Stream] = []
    first_runs: list[Stream] = []
    with grpc.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for _ in range(args.repeats):
            request = tts_pb2.SynthesizeRequest()
            request.CopyFrom(base)
            request.text = text
            long_runs.append(synthesize(stub, request, args.deadline))
            summary = long_runs[-1].summary
            assert summary is not None and summary.segments, "no summary"
            first = summary.segments[0]
            request.text = text[first.text_start : first.text_end]
            first_runs.append(synthesize(stub, request, args.deadline))

    summary = long_runs[0].summary
    assert summary is not None
    long_ttfa = statistics.median(r.ttfa_ms for r in long_runs)
    first_ttfa = statistics.median(r.ttfa_ms for r in first_runs)
    report = {
        "chars": len(text),
        "segments": summary.num_segments,
        "audio_s": long_runs[0].audio_s,
        "repeats": args.repeats,
        "ttfa_long_ms_median": long_ttfa,
        "ttfa_first_segment_ms_median": first_ttfa,
        "ttfa_ratio": long_ttfa / first_ttfa if first_ttfa > 0 else None,
        "ttfa_ratio_goal": 1.2,
        "long_total_ms": [r.total_ms for r in long_runs],
        "long_rtf": [r.total_ms / 1000 / r.audio_s if r.audio_s else None for r in long_runs],
        "underruns": [r.underruns for r in long_runs],
        "underrun_ms": [r.underrun_ms for r in long_runs],
        "boundary_underruns": [r.boundary_underruns for r in long_runs],
        "finish_reasons": {
            name: sum(1 for s in summary.segments if tts_pb2.FinishReason.Name(s.finish_reason) == name)
            for name in ("FINISH_REASON_EOS", "FINISH_REASON_LENGTH", "FINISH_REASON_SILENCE")
        },
        "long_runs": [r.figures() for r in long_runs],
        "first_segment_runs": [r.figures() for r in first_runs],
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
