"""GPU serving benchmark: the talker engine and the streaming decoder in one process, as served.

Not run in CI nor on this project's CPU machines (first run on an H200: deploy/OPERATIONS.md); run it on a GPU host:

    python bench/gpu_serving.py --model /models/Qwen3-TTS-12Hz-1.7B-CustomVoice --speaker ryan \
        --concurrency 1,8,32,64 --requests 128 --json bench/results/gpu_h100_1b7.json

What it measures (one JSON document, also printed):
  * ``startup``: graph capture of every talker and decoder bucket (mode, count, seconds, MiB);
  * ``single_stream``: real-time factor of one stream (synthesis time / audio duration);
  * ``step_time_vs_batch``: median talker decode-step time at each batch size seen;
  * ``load``: per concurrency level C (C streams kept in flight until ``--requests`` finish):
    requests/s, seconds of audio per request and per second of wall time, and p50/p95 time to
    first audio (request arrival -> first decoded PCM chunk, the talker's prefill + first frames
    + the decoder's first chunk);
  * ``peak_device_memory_mib`` (CUDA only).
The goal the serving work is judged against: > 20 requests/s with p95 time to first audio under
77 ms on one H100 (see deploy/OPERATIONS.md for the bandwidth roofline).

Each stream runs like the gateway's pipeline: talker frames are grouped with the decoder's chunk
schedule (first chunk 2 frames, then doubling up to 25) and decoded by a cross-stream batcher
(``decoder_service.server.DecodeBatcher`` over a graph-captured ``SessionBatcher``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from decoder_service.config import DEFAULT_GRAPH_MEMORY
from decoder_service.model.loading import load_codec_decoder
from decoder_service.model.self_check import start_batcher
from decoder_service.model.streaming import ChunkSchedule, DecoderSession
from decoder_service.server import DecodeBatcher
from talker_service.config import FLAGS as TALKER_FLAGS
from talker_service.config import engine_config_from_args
from talker_service.engine import DoneEvent, EngineConfig, FrameEvent, TalkerEngine
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import PromptInputs
from tts_common.compute_thread import ComputeThread
from tts_common.flags import config_from_args
from tts_common.memory import parse_size
from tts_common.stage_main import StageModelConfig
from tts_common.synthesis import SamplingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Please remember to bring your umbrella, because the forecast says it will rain all afternoon.",
    "Our quarterly results exceeded expectations, driven by strong demand in every region.",
    "Turn left at the next intersection, then continue straight for about two kilometres.",
]
FRAME_RATE = 12.5  # codec frames per second of audio


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def server_engine_config(args: argparse.Namespace) -> EngineConfig:
    """The talker server's engine configuration for these flags (its parser and defaults, so the
    bench captures and replays exactly the buckets the server does); ``--max-slots`` default: the
    largest concurrency level."""
    slots = args.max_slots or max(int(c) for c in args.concurrency.split(","))
    argv = ["--model", args.model, "--device", args.device, "--dtype", args.dtype]
    argv += ["--max-slots", str(slots), "--max-seq-len", str(args.max_seq_len)]
    namespace = TALKER_FLAGS.parser({}).parse_args(argv)
    return engine_config_from_args(config_from_args(StageModelConfig, namespace), namespace)


class Bench:
    """The two stages, loaded once."""

    def __init__(self, args: argparse.Namespace) -> None:
        dtype = getattr(torch, args.dtype)
        self.args = args
        self.config = server_engine_config(args)
        self.batch_sizes: dict[int, list[float]] = {}
        t0 = time.perf_counter()
        self.model = TalkerModel.from_checkpoint(args.model, args.device, dtype)
        self.engine = TalkerEngine(self.model, self.config)  # captures every talker bucket
        talker_load = time.perf_counter() - t0
        self.engine.on_step.append(lambda b, s: self.batch_sizes.setdefault(b, []).append(s))
        self.compute = ComputeThread("bench-decoder")
        graphs = self.engine.runner.graphs
        self.startup: dict[str, object] = {
            "talker_load_s": round(talker_load, 2),
            "talker_graphs": None if graphs is None else _report(graphs.report),
        }

    async def load_decoder(self) -> None:
        """The decoder and its batcher, on the decoder's compute thread (as the decoder process)."""
        self.decoder = await self.compute.run(
            load_codec_decoder, self.args.model, self.args.device, torch.float32
        )
        # The decoder server's batcher: its buckets, captured and self-checked as at its start.
        self.session_batcher, _ = await self.compute.run(
            start_batcher, self.decoder, "auto", graph_memory=self.args.decoder_graph_memory or None
        )
        graphs = self.session_batcher.graphs
        self.startup["decoder_graphs"] = None if graphs is None else _report(graphs.report)

    def inputs(self, i: int) -> PromptInputs:
        return PromptInputs(
            text=TEXTS[i % len(TEXTS)],
            non_streaming_text=False,
            speaker=self.args.speaker,
            instruct=self.args.instruct,
        )

    async def one_stream(self, i: int, batcher: DecodeBatcher) -> tuple[float, float, float]:
        """(time to first audio s, total s, audio s) of one request."""
        sampling = SamplingParams(seed=i) if self.args.sample else SamplingParams.greedy()
        session = DecoderSession(self.decoder)
        sizes = ChunkSchedule().sizes()
        want = next(sizes)
        pending: list[list[int]] = []
        t0 = time.perf_counter()
        first_audio = None
        samples = 0

        async def flush() -> None:
            nonlocal first_audio, samples, pending
            audio = await batcher.decode(session, np.asarray(pending, dtype=np.int64))
            samples += audio.shape[0]
            if first_audio is None:
                first_audio = time.perf_counter() - t0
            pending = []

        async for event in self.engine.generate(
            f"bench-{i}", self.inputs(i), sampling, self.args.max_new_tokens
        ):
            if isinstance(event, FrameEvent):
                pending.append(event.codes)
                if len(pending) >= want:
                    await flush()
                    want = next(sizes)
            elif isinstance(event, DoneEvent) and event.error is not None:
                raise event.error
        if pending:
            await flush()
        total = time.perf_counter() - t0
        sample_rate = self.decoder.samples_per_frame * FRAME_RATE
        return first_audio if first_audio is not None else total, total, samples / sample_rate

    async def load_level(self, concurrency: int, requests: int) -> dict[str, float]:
        batcher = DecodeBatcher(self.session_batcher, self.compute)
        batcher.start()
        gate = asyncio.Semaphore(concurrency)
        results: list[tuple[float, float, float]] = []

        async def run(i: int) -> None:
            async with gate:
                results.append(await self.one_stream(i, batcher))

        t0 = time.perf_counter()
        await asyncio.gather(*(run(i) for i in range(requests)))
        wall = time.perf_counter() - t0
        await batcher.close()
        ttfa = [r[0] * 1e3 for r in results]
        return {
            "concurrency": concurrency,
            "requests": requests,
            "requests_per_s": round(requests / wall, 2),
            "ttfa_p50_ms": round(_percentile(ttfa, 50), 1),
            "ttfa_p95_ms": round(_percentile(ttfa, 95), 1),
            "rtf_mean": round(statistics.fmean(r[1] / max(r[2], 1e-9) for r in results), 3),
            # requests/s depends on how long the requests are (a random checkpoint's greedy codes
            # decide when it stops): the audio they made says what the level served
            "audio_s_per_request": round(statistics.fmean(r[2] for r in results), 2),
            "audio_s_per_s": round(sum(r[2] for r in results) / wall, 2),
        }


def _report(report: object) -> dict[str, object]:
    return {
        "mode": report.mode,  # type: ignore[attr-defined]
        "graphs": len(report.names),  # type: ignore[attr-defined]
        "seconds": round(report.seconds, 2),  # type: ignore[attr-defined]
        "held_mib": round(report.pool_bytes / 2**20, 1),  # type: ignore[attr-defined]
        "peak_mib": round(report.peak_bytes / 2**20, 1),  # type: ignore[attr-defined]
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    bench = Bench(args)
    await bench.load_decoder()
    with bench.engine:
        single = await bench.load_level(1, args.single_requests)
        bench.batch_sizes.clear()
        levels = [await bench.load_level(int(c), args.requests) for c in args.concurrency.split(",")]
    result: dict[str, object] = {
        "machine": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "model": str(args.model),
        "dtype": args.dtype,
        "sampling": args.sample,
        "startup": bench.startup,
        "single_stream": {"rtf": single["rtf_mean"], "ttfa_p50_ms": single["ttfa_p50_ms"]},
        "step_time_vs_batch": {
            b: round(statistics.median(times) * 1e3, 2) for b, times in sorted(bench.batch_sizes.items())
        },
        "load": levels,
    }
    if torch.cuda.is_available():
        result["peak_device_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    bench.compute.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="checkpoint directory (CustomVoice or VoiceDesign)")
    parser.add_argument("--speaker", default=None, help="preset speaker (CustomVoice)")
    parser.add_argument("--instruct", default=None, help="voice instruction (VoiceDesign)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument(
        "--max-slots", type=int, default=None, help="talker slots (default: the largest concurrency)"
    )
    parser.add_argument("--requests", type=int, default=128, help="requests per concurrency level")
    parser.add_argument("--single-requests", type=int, default=4, help="requests of the single-stream run")
    parser.add_argument("--sample", action="store_true", help="seeded sampling instead of greedy")
    parser.add_argument(
        "--decoder-graph-memory",
        type=parse_size,
        default=DEFAULT_GRAPH_MEMORY,
        help="the decoder's --graph-memory, e.g. 4GiB (0: no bound; default: the decoder server's)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
