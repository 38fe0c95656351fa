"""Time to first byte over the OpenAI-compatible HTTP API vs gRPC, for the same request.

One running gateway, both of its listeners: for each format (``pcm`` and ``mp3`` by default) the
same synthesis (text, voice, instructions, seed, max_new_tokens, format) is sent alternately as
``POST /v1/audio/speech`` through the official ``openai`` SDK (``with_streaming_response``, the
bytes read as they arrive) and as a gRPC ``Synthesize`` call; both transports keep their
connections open across requests, so the figures are per request, not per connection. TTFB is
the time from sending the request to the first audio byte in hand (HTTP: the first body bytes;
gRPC: the first non-empty ``AudioChunk``); ``total`` is to the last byte. One request at a time.

    qwen3-tts up &     # the dev checkpoint: gRPC 50051, HTTP 8000
    python bench/http_ttfb.py --gateway 127.0.0.1:50051 --http http://127.0.0.1:8000 --requests 50
    python bench/http_ttfb.py ... --formats pcm mp3 opus --json bench/results/http_ttfb.json

Prints one row per format and transport (p50/p95/mean TTFB and total, ms) and HTTP's median
overhead over gRPC; ``--json`` writes every sample too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import openai

from gateway.transports.http.formats import RESPONSE_FORMATS
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

TRANSPORTS = ("http", "grpc")


@dataclass
class Sample:
    ttfb_ms: float
    total_ms: float
    audio_bytes: int


@dataclass
class Series:
    format: str
    transport: str
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            arr = np.asarray(values)
            return {
                "p50": float(np.percentile(arr, 50)),
                "p95": float(np.percentile(arr, 95)),
                "mean": float(arr.mean()),
            }

        return {
            "format": self.format,
            "transport": self.transport,
            "requests": len(self.samples),
            "ttfb_ms": stats([s.ttfb_ms for s in self.samples]),
            "total_ms": stats([s.total_ms for s in self.samples]),
            "audio_bytes": statistics.median(s.audio_bytes for s in self.samples),
        }


@dataclass(frozen=True)
class Request:
    """One synthesis, spelt for both transports."""

    text: str
    voice: str
    instructions: str
    seed: int
    max_new_tokens: int
    format: str
    model: str = ""
    """A served model ("": the gateway's default)."""

    def grpc(self) -> tts_pb2.SynthesizeRequest:
        request = tts_pb2.SynthesizeRequest(
            model=self.model,
            text=self.text,
            instruct=self.instructions,
            sampling=tts_pb2.SamplingOptions(seed=self.seed, max_new_tokens=self.max_new_tokens),
            output=tts_pb2.AudioFormat(encoding=RESPONSE_FORMATS[self.format].encoding),
        )
        if self.voice:
            # A registered voice id, or a preset speaker (the HTTP API resolves both the same way).
            if self.voice.startswith("voice-"):
                request.voice_id = self.voice
            else:
                request.speaker = self.voice
        return request

    def http_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "input": self.text,
            "voice": self.voice or "default",  # voice_design models ignore it
            "response_format": self.format,
            "extra_body": {"seed": self.seed, "max_new_tokens": self.max_new_tokens},
        }
        if self.instructions:
            kwargs["instructions"] = self.instructions
        return kwargs


async def via_http(sdk: openai.AsyncOpenAI, request: Request) -> Sample:
    start = time.perf_counter()
    first: float | None = None
    size = 0
    async with sdk.audio.speech.with_streaming_response.create(**request.http_kwargs()) as response:
        async for piece in response.iter_bytes():
            if piece and first is None:
                first = time.perf_counter()
            size += len(piece)
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("HTTP: no audio")
    return Sample((first - start) * 1000, (end - start) * 1000, size)


async def via_grpc(
    stub: tts_pb2_grpc.TextToSpeechStub, request: Request, metadata: list[tuple[str, str]]
) -> Sample:
    start = time.perf_counter()
    first: float | None = None
    size = 0
    async for response in stub.Synthesize(request.grpc(), metadata=metadata or None):
        if response.WhichOneof("payload") == "audio" and response.audio.data:
            if first is None:
                first = time.perf_counter()
            size += len(response.audio.data)
    end = time.perf_counter()
    if first is None:
        raise RuntimeError("gRPC: no audio")
    return Sample((first - start) * 1000, (end - start) * 1000, size)


async def run(args: argparse.Namespace) -> list[Series]:
    sdk = openai.AsyncOpenAI(
        base_url=args.http.rstrip("/") + "/v1", api_key=args.api_key or "unused", max_retries=0, timeout=120
    )
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else []
    series = {(f, t): Series(f, t) for f in args.formats for t in TRANSPORTS}
    async with grpc.aio.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)

        async def one(fmt: str, transport: str) -> Sample:
            request = Request(
                args.text, args.voice, args.instructions, args.seed, args.max_new_tokens, fmt, args.model
            )
            if transport == "http":
                return await via_http(sdk, request)
            return await via_grpc(stub, request, metadata)

        for fmt in args.formats:  # warm-up: connections, caches, encoder set-up
            for transport in TRANSPORTS:
                for _ in range(args.warmup):
                    await one(fmt, transport)
        for i in range(args.requests):
            for fmt in args.formats:
                # Alternate which transport goes first, so neither always follows the other.
                order = TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]
                for transport in order:
                    series[fmt, transport].samples.append(await one(fmt, transport))
    await sdk.close()
    return list(series.values())


def report(results: list[Series]) -> str:
    lines = [
        f"{'format':<7}{'transport':<10}{'n':>4}  {'ttfb p50':>9}{'p95':>9}{'mean':>9}  {'total p50':>10}"
    ]
    by_key = {(s.format, s.transport): s.summary() for s in results}
    for (fmt, transport), row in by_key.items():
        ttfb, total = row["ttfb_ms"], row["total_ms"]
        lines.append(
            f"{fmt:<7}{transport:<10}{row['requests']:>4}  {ttfb['p50']:>9.1f}{ttfb['p95']:>9.1f}"
            f"{ttfb['mean']:>9.1f}  {total['p50']:>10.1f}"
        )
    for fmt in dict.fromkeys(s.format for s in results):
        sizes = {by_key[fmt, t]["audio_bytes"] for t in TRANSPORTS}
        if len(sizes) > 1:  # the same request with the same seed should give the same audio
            lines.append(f"{fmt}: WARNING: the transports returned different amounts of audio: {sizes}")
        delta = by_key[fmt, "http"]["ttfb_ms"]["p50"] - by_key[fmt, "grpc"]["ttfb_ms"]["p50"]
        lines.append(f"{fmt}: HTTP - gRPC median TTFB = {delta:+.1f} ms")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", default="127.0.0.1:50051", help="the gateway's gRPC address")
    p.add_argument("--http", default="http://127.0.0.1:8000", help="the same gateway's HTTP API")
    p.add_argument("--api-key", default="", help="when the gateway requires one")
    p.add_argument("--formats", nargs="+", default=["pcm", "mp3"], choices=sorted(RESPONSE_FORMATS))
    p.add_argument("--requests", type=int, default=20, help="measured requests per format and transport")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests per format and transport")
    p.add_argument("--text", default="Hello world, this is a quick test of the time to first byte.")
    p.add_argument("--model", default="", help="a served model (default: the gateway's default)")
    p.add_argument("--voice", default="", help="preset speaker or voice id ('' for voice_design models)")
    p.add_argument("--instructions", default="")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the model's default budget")
    p.add_argument("--json", type=Path, default=None, help="write the summary and every sample here")
    args = p.parse_args(argv)
    if args.requests < 1 or args.warmup < 0:
        p.error("--requests must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(report(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "summary": [s.summary() for s in results],
                    "samples": [
                        {"format": s.format, "transport": s.transport, **asdict(x)}
                        for s in results
                        for x in s.samples
                    ],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
