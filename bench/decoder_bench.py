"""Speech-tokenizer decoder: whole-utterance vs streaming, and batched concurrent streams.

Builds a decoder with random weights at the REAL dimensions of the released speech tokenizer
(ARCHITECTURE.md §2.5: hidden 512, 8 layers, latent 1024, decoder_dim 1536, 1920x upsampling)
and measures, in one run:
  * decode seconds per audio second (real-time factor, RTF) of one utterance decoded whole
    (``CodecDecoder.decode``) and streamed with the chunk schedule (``DecoderSession.feed``);
  * first-chunk latency: the time to decode a fresh stream's first chunk (``--first`` frames);
  * aggregate throughput (audio seconds per wall second) of N concurrent streams advanced together
    with one batched forward per schedule step (``advance_sessions``) vs the same streams decoded
    one after another.

Example (figures in the report):
    python bench/decoder_bench.py --threads 2 --frames 100 --concurrency-frames 25 --repeat 2 \
        --json bench/results/decoder.json
(also prints a roofline: the whole decode's GFLOP/s against the machine's dense-product ceiling,
which bounds what batching streams can gain on this machine)
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from decoder_service.model.decoder import CodecDecoder
from decoder_service.model.random_init import init_random_weights
from decoder_service.model.streaming import ChunkSchedule, DecoderSession, advance_sessions
from tts_common.release_dims import release_decoder_config


def build_decoder(dtype: torch.dtype, seed: int) -> CodecDecoder:
    return init_random_weights(CodecDecoder(release_decoder_config()), seed=seed).to(dtype).eval()


def random_codes(dec: CodecDecoder, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, dec.config.codebook_size, (frames, dec.num_quantizers), generator=gen)


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_time(fn: Any, repeat: int = 3) -> float:
    """Seconds of the fastest of ``repeat`` calls of ``fn``, after one warm-up call."""
    fn()
    return min(timed(fn) for _ in range(repeat))


def best_of(repeat: int, fn: Any) -> tuple[Any, float]:
    """Run ``fn`` ``repeat`` times: (the result of the fastest run, its process CPU seconds).

    ``fn`` returns a wall-time figure first (or a tuple starting with one). The fastest run is the
    least disturbed by other processes on a shared machine; CPU seconds (all threads) show how
    much of the wall time the process actually ran.
    """
    best: Any = None
    best_cpu = 0.0
    for _ in range(max(1, repeat)):
        c0 = time.process_time()
        res = fn()
        cpu = time.process_time() - c0
        key = res[0] if isinstance(res, tuple) else res
        if best is None or key < (best[0] if isinstance(best, tuple) else best):
            best, best_cpu = res, cpu
    return best, best_cpu


def stream_one(dec: CodecDecoder, codes: torch.Tensor, sched: ChunkSchedule) -> tuple[float, float]:
    """(total seconds, first-chunk seconds) to stream ``codes`` through a fresh session."""
    session = DecoderSession(dec)
    times, i = [], 0
    for n in sched.split(codes.shape[0]):
        times.append(timed(functools.partial(session.feed, codes[i : i + n])))
        i += n
    return sum(times), times[0]


def stream_batched(dec: CodecDecoder, streams: list[torch.Tensor], sched: ChunkSchedule) -> float:
    """Seconds to stream all ``streams`` together: one batched forward per schedule step."""
    sessions = [DecoderSession(dec) for _ in streams]
    total, i = 0.0, 0
    for n in sched.split(max(s.shape[0] for s in streams)):
        chunks = [s[i : i + n] for s in streams]
        total += timed(functools.partial(advance_sessions, sessions, chunks))
        i += n
    return total


def attainable_gflops(threads: int) -> float:
    """The best fp32 GFLOP/s this machine reaches on large dense products (ceiling for batching).

    Best of a 2048^3 ``torch.mm`` and a pre-packed oneDNN linear of 256x2048 by 2048x2048.
    """
    from tts_common.onednn_linear import OneDnnLinear, onednn_linear_available

    a, w = torch.randn(2048, 2048), torch.randn(2048, 2048)
    candidates = [lambda: torch.mm(a, w)]
    if onednn_linear_available():
        layer = OneDnnLinear(torch.nn.Linear(2048, 2048, bias=False))
        x = torch.randn(256, 2048)
        candidates.append(lambda: [layer(x) for _ in range(8)])  # same FLOPs as the mm
    best = 0.0
    for fn in candidates:
        best = max(best, 2 * 2048**3 / best_time(fn) / 1e9)
    return best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--frames", type=int, default=100, help="utterance length for whole vs streaming (12.5 frames/s)"
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="concurrent stream counts")
    p.add_argument(
        "--concurrency-frames", type=int, default=50, help="frames per stream in the concurrency runs"
    )
    p.add_argument("--first", type=int, default=2, help="schedule: first chunk (frames)")
    p.add_argument("--growth", type=float, default=2.0, help="schedule: growth factor")
    p.add_argument("--max-chunk", type=int, default=25, help="schedule: largest chunk (frames)")
    p.add_argument(
        "--first-chunk-repeats", type=int, default=5, help="fresh streams timed for first-chunk latency"
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per measurement; the fastest is reported")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    sched = ChunkSchedule(first=args.first, growth=args.growth, max=args.max_chunk)
    dec = build_decoder(dtype, args.seed)
    spf, rate = dec.samples_per_frame, 24000
    sec_per_frame = spf / rate
    codes = random_codes(dec, args.frames, args.seed)
    audio_s = args.frames * sec_per_frame

    with torch.inference_mode():
        dec.decode(codes[:4])  # warm-up (oneDNN primitives, codebook tables)
        stream_one(dec, codes[: 2 * args.max_chunk], sched)
        whole_s, whole_cpu = best_of(args.repeat, lambda: timed(lambda: dec.decode(codes)))
        # Roofline: batching streams cannot beat the machine's dense-product ceiling, so
        # ceiling / (whole-decode GFLOP/s) bounds any batched-vs-sequential speedup.
        flop_counter = FlopCounterMode(display=False)
        with flop_counter:
            dec.decode(codes)
        whole_gflops = flop_counter.get_total_flops() / 1e9
        ceiling = attainable_gflops(args.threads)
        (stream_s, first_s), stream_cpu = best_of(args.repeat, lambda: stream_one(dec, codes, sched))
        firsts = [stream_one(dec, codes[: args.first], sched)[0] for _ in range(args.first_chunk_repeats)]
        conc: list[dict[str, Any]] = []
        for n in args.concurrency:
            streams = [random_codes(dec, args.concurrency_frames, args.seed + 1 + k) for k in range(n)]
            total_audio = n * args.concurrency_frames * sec_per_frame
            batched_s, batched_cpu = best_of(
                args.repeat, functools.partial(stream_batched, dec, streams, sched)
            )
            sequential_s, sequential_cpu = best_of(
                args.repeat, lambda streams=streams: sum(stream_one(dec, s, sched)[0] for s in streams)
            )
            conc.append(
                {
                    "streams": n,
                    "audio_s": total_audio,
                    "batched_s": batched_s,
                    "batched_cpu_s": batched_cpu,
                    "sequential_s": sequential_s,
                    "sequential_cpu_s": sequential_cpu,
                    "batched_x_realtime": total_audio / batched_s,
                    "sequential_x_realtime": total_audio / sequential_s,
                    "speedup": sequential_s / batched_s,
                }
            )

    result: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": args.threads,
            "torch": torch.__version__,
        },
        "dtype": args.dtype,
        "schedule": {
            "first": args.first,
            "growth": args.growth,
            "max": args.max_chunk,
            "chunks": sched.split(args.frames),
        },
        "frames": args.frames,
        "audio_s": audio_s,
        "repeat": args.repeat,
        "whole": {
            "seconds": whole_s,
            "cpu_seconds": whole_cpu,
            "rtf": whole_s / audio_s,
            "gflop": whole_gflops,
            "gflop_per_s": whole_gflops / whole_s,
        },
        "roofline": {
            "attainable_gflop_per_s": ceiling,
            "max_batching_speedup": ceiling / (whole_gflops / whole_s),
        },
        "streaming": {"seconds": stream_s, "cpu_seconds": stream_cpu, "rtf": stream_s / audio_s},
        "first_chunk": {
            "frames": args.first,
            "audio_ms": args.first * sec_per_frame * 1000,
            "latency_ms_in_stream": first_s * 1000,
            "latency_ms_min": min(firsts) * 1000,
            "latency_ms_median": sorted(firsts)[len(firsts) // 2] * 1000,
        },
        "concurrency": conc,
    }

    print(f"decoder at release dims, {args.dtype}, {args.threads} threads, torch {torch.__version__}")
    print(f"utterance: {args.frames} frames = {audio_s:.2f} s audio; schedule {result['schedule']['chunks']}")
    print(f"{'mode':<28}{'wall s':>10}{'s per audio s':>16}{'cpu s':>10}")
    print(f"{'whole-utterance decode':<28}{whole_s:>10.2f}{whole_s / audio_s:>16.3f}{whole_cpu:>10.2f}")
    print(f"{'streaming (schedule)':<28}{stream_s:>10.2f}{stream_s / audio_s:>16.3f}{stream_cpu:>10.2f}")
    print(
        f"whole decode: {whole_gflops:.0f} GFLOP at {whole_gflops / whole_s:.0f} GFLOP/s; machine ceiling "
        f"{ceiling:.0f} GFLOP/s -> batching can gain at most {result['roofline']['max_batching_speedup']:.2f}x"
    )
    fc = result["first_chunk"]
    print(
        f"first chunk ({args.first} frames = {fc['audio_ms']:.0f} ms audio): "
        f"min {fc['latency_ms_min']:.0f} ms, median {fc['latency_ms_median']:.0f} ms"
    )
    print(
        f"\nconcurrent streams, {args.concurrency_frames} frames each "
        f"({args.concurrency_frames * sec_per_frame:.1f} s audio), aggregate x realtime:"
    )
    print(
        f"{'streams':>8}{'batched s':>11}{'(cpu s)':>9}{'batched xRT':>13}"
        f"{'sequential s':>14}{'(cpu s)':>9}{'seq xRT':>9}{'speedup':>9}"
    )
    for c in conc:
        print(
            f"{c['streams']:>8}{c['batched_s']:>11.2f}{c['batched_cpu_s']:>9.2f}{c['batched_x_realtime']:>13.2f}"
            f"{c['sequential_s']:>14.2f}{c['sequential_cpu_s']:>9.2f}{c['sequential_x_realtime']:>9.2f}"
            f"{c['speedup']:>9.2f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
