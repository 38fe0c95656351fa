"""Load generator for the gateway: open-loop (Poisson arrivals) or closed-loop (fixed concurrency).

Reports p50/p95/p99 time to first audio and end-to-end latency, RTF, audio seconds generated per
wall second, playback underruns (``playback.Playback``: a chunk arriving after the audio before it
has played out, for a real-time player started at the first chunk that resumes after each gap)
and counts by final gRPC status; writes JSON and an SVG plot.

    python bench/load.py --gateway 127.0.0.1:50051 --mode closed --concurrency 8 --requests 64
    python bench/load.py --gateway 127.0.0.1:50051 --mode open --rate 2 --duration 30 --json out.json --plot out.svg

Every loop is bounded by --requests / --duration and per-request deadlines; traffic goes only to
the given gateway address (loopback in this project's tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np
from playback import Playback

from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

TEXTS = [
    "Hello world, this is a quick test.",
    "She said she would be here by noon.",
    "The quick brown fox jumps over the lazy dog.",
    "Streaming speech should start quickly and never stutter.",
]


@dataclass
class Result:
    status: str
    ttfa_ms: float | None = None
    total_ms: float = 0.0
    audio_s: float = 0.0
    underruns: int = 0
    underrun_ms: float = 0.0
    chunks: int = 0


@dataclass
class Report:
    mode: str
    requests: int
    wall_s: float
    by_status: dict[str, int] = field(default_factory=dict)
    ttfa_ms: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    rtf_mean: float = 0.0
    audio_seconds_per_second: float = 0.0
    underrun_requests: int = 0
    underruns_total: int = 0


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values)
    return {f"p{p}": float(np.percentile(arr, p)) for p in (50, 95, 99)} | {"mean": float(arr.mean())}


async def one_request(stub, args, rng: random.Random, sample_rate: int = 24000) -> Result:
    request = tts_pb2.SynthesizeRequest(
        model=args.model,
        text=rng.choice(TEXTS),
        language=args.language,
        sampling=tts_pb2.SamplingOptions(seed=rng.randrange(2**31), max_new_tokens=args.max_new_tokens),
        output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_PCM16),
    )
    if args.speaker:
        request.speaker = args.speaker
    elif args.voice_id:
        request.voice_id = args.voice_id
    t0 = time.monotonic()
    res = Result(status="OK")
    player = Playback()
    try:
        call = stub.Synthesize(request, timeout=args.deadline, metadata=args.metadata)
        async for response in call:
            if response.WhichOneof("payload") != "audio":
                continue
            now = time.monotonic()
            if player.first_at is None:
                res.ttfa_ms = (now - t0) * 1000
            player.chunk(now, response.audio.num_samples / (response.audio.sample_rate or sample_rate))
            res.chunks += 1
    except grpc.aio.AioRpcError as exc:
        res.status = exc.code().name
    res.total_ms = (time.monotonic() - t0) * 1000
    res.audio_s = player.played_s
    res.underruns = player.underruns
    res.underrun_ms = player.underrun_ms
    return res


async def run(args) -> tuple[Report, list[Result]]:
    rng = random.Random(args.seed)
    results: list[Result] = []
    async with grpc.aio.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        t0 = time.monotonic()
        if args.mode == "closed":
            counter = iter(range(args.requests))

            async def worker() -> None:
                for _ in counter:
                    results.append(await one_request(stub, args, rng))

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        else:
            tasks = []
            deadline = t0 + args.duration
            while time.monotonic() < deadline and len(tasks) < args.requests:
                tasks.append(asyncio.create_task(one_request(stub, args, rng)))
                await asyncio.sleep(rng.expovariate(args.rate))
            results = list(await asyncio.gather(*tasks))
        wall = time.monotonic() - t0
    ok = [r for r in results if r.status == "OK"]
    report = Report(mode=args.mode, requests=len(results), wall_s=wall)
    for r in results:
        report.by_status[r.status] = report.by_status.get(r.status, 0) + 1
    report.ttfa_ms = percentiles([r.ttfa_ms for r in ok if r.ttfa_ms is not None])
    report.latency_ms = percentiles([r.total_ms for r in ok])
    rtfs = [r.total_ms / 1000 / r.audio_s for r in ok if r.audio_s > 0]
    report.rtf_mean = statistics.mean(rtfs) if rtfs else 0.0
    report.audio_seconds_per_second = sum(r.audio_s for r in ok) / wall if wall > 0 else 0.0
    report.underrun_requests = sum(1 for r in ok if r.underruns)
    report.underruns_total = sum(r.underruns for r in ok)
    return report, results


def svg_plot(results: list[Result], path: Path) -> None:
    """CDFs of time to first audio and end-to-end latency (dependency-free SVG)."""
    series = {
        "time to first audio": sorted(r.ttfa_ms for r in results if r.ttfa_ms is not None),
        "end-to-end": sorted(r.total_ms for r in results if r.status == "OK"),
    }
    xmax = max([v[-1] for v in series.values() if v] or [1.0])
    w, h, pad = 640, 360, 50
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">latency (ms), max {xmax:.0f}</text>',
        f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">fraction of requests</text>',
    ]
    for (name, values), color, dy in zip(series.items(), ["#1f77b4", "#d62728"], [0, 16]):
        if not values:
            continue
        pts = " ".join(
            f"{pad + (w - 2 * pad) * v / xmax:.1f},{h - pad - (h - 2 * pad) * (i + 1) / len(values):.1f}"
            for i, v in enumerate(values)
        )
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
        lines.append(f'<text x="{w - pad - 150}" y="{pad + dy}" fill="{color}">{name}</text>')
    lines.append("</svg>")
    path.write_text("\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    """The flags of a load run (also how other benches spell one: ``bench/cpu_serving.py``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="127.0.0.1:50051")
    ap.add_argument("--mode", choices=["open", "closed"], default="closed")
    ap.add_argument("--concurrency", type=int, default=4, help="closed loop: requests in flight")
    ap.add_argument("--rate", type=float, default=1.0, help="open loop: mean arrivals per second")
    ap.add_argument("--duration", type=float, default=30.0, help="open loop: seconds of arrivals")
    ap.add_argument("--requests", type=int, default=32, help="upper bound on requests sent")
    ap.add_argument("--model", default="", help="a served model (default: the gateway's default)")
    ap.add_argument("--speaker")
    ap.add_argument("--voice-id")
    ap.add_argument("--language", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=120)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--api-key")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``argv`` (default: the command line) as a load run's arguments, ``metadata`` included."""
    args = build_parser().parse_args(argv)
    args.metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    return args


def main() -> None:
    args = parse_args()
    report, results = asyncio.run(run(args))
    print(json.dumps(asdict(report), indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"report": asdict(report), "results": [asdict(r) for r in results]}, indent=2)
        )
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        svg_plot(results, args.plot)


if __name__ == "__main__":
    main()
