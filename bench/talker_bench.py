"""Talker throughput: the offline path (one request) vs the engine at 1..16 concurrent requests.

Builds a talker with random weights at the REAL dimensions of a released checkpoint (default
0.6B; weights never leave memory) and measures, in one run, on the one decode loop (the engine):
  * offline: one request through ``TalkerEngine.generate_all`` (what ``qwen3-tts synthesize`` runs;
    per-frame time);
  * engine: N concurrent requests (N in --concurrency), aggregate and per-request frames/s;
  * time from a request's arrival to its first frame while N-1 others are running.

Example (writes bench/results/talker_0b6.json, the figures quoted in the issue notes):
    python bench/talker_bench.py --size 0b6 --threads 2 --frames 32 --repeat 2 --concurrency 1,4,16 \
        --json bench/results/talker_0b6.json
The linear kernels are chosen once, before any engine, for the largest concurrency's batch buckets
(``--linear auto``: measured per shape, as the talker server does; the table is printed), and the
report sets the offline ms/frame against the floor of the dtype: the weight bytes one frame streams
(talker once, code predictor 15 times) over the read bandwidth measured in the same run.
``--dtype auto`` resolves as the stages do (measured); ``--quantization int8`` as the talker's flag.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from talker_service.engine import DoneEvent, EngineConfig, FrameEvent, TalkerEngine
from talker_service.engine.dtype_probe import talker_step_probe
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import TalkerPrompt
from talker_service.model.talker import Talker
from tts_common.compute_thread import call_in_fresh_thread
from tts_common.config import CheckpointConfig, GenerationConfig, Qwen3TTSConfig, SpeechTokenizerConfig
from tts_common.cpu_info import cpu_identity
from tts_common.kernels.choice import set_up_linears
from tts_common.precision import LINEAR_CHOICES, QUANTIZATION_CHOICES, resolve_dtype
from tts_common.release_dims import release_model_config, speech_tokenizer_config_dict
from tts_common.synthesis import SamplingParams


def model_config(size: str) -> Qwen3TTSConfig:
    """The dev (tiny) or released dimensions."""
    if size == "dev":
        from qwen3_tts.dev_model import dev_model_config

        return Qwen3TTSConfig.from_dict(dev_model_config("custom_voice", size))
    return release_model_config(size, "custom_voice")


def build_model(size: str, dtype: torch.dtype) -> TalkerModel:
    """Random talker weights at the dev (tiny) or released dimensions, the EOS logit zeroed
    (fixed-length runs)."""
    cfg = model_config(size)
    if size == "dev":
        from qwen3_tts.dev_model import dev_speech_tokenizer_config

        tokenizer_config = dev_speech_tokenizer_config(size)
    else:
        tokenizer_config = speech_tokenizer_config_dict()
    torch.manual_seed(0)
    talker = Talker(cfg.talker).to(dtype).eval().requires_grad_(False)
    with torch.no_grad():
        talker.codec_head.weight[cfg.talker.codec_eos_token_id].zero_()  # fixed-length runs
    ckpt = CheckpointConfig(
        path=Path("."),
        model=cfg,
        speech_tokenizer=SpeechTokenizerConfig.from_dict(tokenizer_config),
        generation=GenerationConfig(),
    )
    return TalkerModel(config=ckpt, tokenizer=None, talker=talker, device=torch.device("cpu"), dtype=dtype)  # type: ignore[arg-type]


def dtype_and_quantization(name: str) -> tuple[str, str]:
    """A benchmark's dtype entry as (``--dtype``, ``--quantization``): ``int8`` (``w8a8``) is
    float32 with that quantization, ``DTYPE+int8`` (``auto+w8a8``) that dtype with it, any other a
    dtype alone."""
    quantized = [q for q in QUANTIZATION_CHOICES if q != "none"]
    if name in quantized:
        name = f"float32+{name}"
    dtype, plus, quantization = name.partition("+")
    if plus and quantization not in quantized:
        raise ValueError(f"{name}: +{quantization} is no quantization (choose from {', '.join(quantized)})")
    return dtype, quantization or "none"


def frame_weight_bytes(talker: Talker) -> int:
    """Weight bytes one decode frame streams: the talker's layers and codec head once, the code
    predictor's layers, input projection and one head per codebook after the first (embedding
    rows read are negligible)."""

    def size(module: torch.nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])

    backbone = size(talker.model.layers) + size(talker.model.norm) + size(talker.codec_head)
    cp = talker.code_predictor
    per_step = size(cp.model.layers) + size(cp.lm_head[0]) + size(cp.small_to_mtp_projection)
    return backbone + (cp.num_groups - 1) * per_step


def read_bandwidth_gbs(mib: int = 512, repeat: int = 5) -> float:
    """Best-of-``repeat`` GB/s of a sum over a buffer far larger than the caches (weights are
    only read, so this is what a decode step's floor is set against)."""
    buf = torch.ones(mib * 2**20 // 4)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best / 1e9


def random_prompt(model: TalkerModel, prefill_len: int, seed: int) -> TalkerPrompt:
    g = torch.Generator().manual_seed(seed)
    h = model.config.model.talker.hidden_size
    return TalkerPrompt(
        prefill=torch.randn(prefill_len, h, generator=g, dtype=model.dtype) * 0.02,
        trailing=torch.randn(1, h, generator=g, dtype=model.dtype) * 0.02,
        tts_pad=torch.zeros(h, dtype=model.dtype),
        text_tokens=12,
    )


def bench_offline(model: TalkerModel, frames: int, prefill_len: int, linear: str) -> dict:
    """One request through ``TalkerEngine.generate_all``: what ``qwen3-tts synthesize`` runs."""
    prompt = random_prompt(model, prefill_len, 0)
    config = EngineConfig(max_slots=1, max_seq_len=prefill_len + frames + 8, linear=linear)
    engine = call_in_fresh_thread(TalkerEngine, model, config)  # allocates the KV cache
    with engine:
        engine.generate_all([(prompt, SamplingParams.greedy(), 3)])  # warm-up
        t0 = time.perf_counter()
        out = engine.generate_all([(prompt, SamplingParams.greedy(), frames + 1)])
        dt = time.perf_counter() - t0
    n = out[0].codes.shape[0]
    return {"frames": n, "seconds": dt, "ms_per_frame": 1000 * dt / n, "frames_per_s": n / dt}


def bench_engine(model: TalkerModel, concurrency: int, frames: int, prefill_len: int, linear: str) -> dict:
    config = EngineConfig(max_slots=max(concurrency, 1), max_seq_len=prefill_len + frames + 8, linear=linear)
    engine = call_in_fresh_thread(TalkerEngine, model, config)  # allocates the KV cache
    engine.start()
    done = threading.Event()
    lock = threading.Lock()
    arrivals: dict[int, float] = {}
    first: dict[int, float] = {}
    frame_times: list[float] = []
    ends: list[float] = []
    counts = [0] * concurrency

    def sink_for(i: int):
        def sink(event) -> None:
            now = time.perf_counter()
            with lock:
                if isinstance(event, FrameEvent):
                    counts[i] += 1
                    first.setdefault(i, now)
                    frame_times.append(now)
                elif isinstance(event, DoneEvent):
                    ends.append(now)
                    if len(ends) == concurrency:
                        done.set()

        return sink

    # Warm-up request (allocator, first-call costs).
    warm = threading.Event()
    engine.add(
        "warm",
        random_prompt(model, prefill_len, 99),
        SamplingParams.greedy(),
        3,
        lambda e: warm.set() if isinstance(e, DoneEvent) else None,
    )
    warm.wait()
    t0 = time.perf_counter()
    # N-1 requests start together; the last arrives once they are all decoding, and its time to
    # first frame is the "arrival while N-1 others run" figure.
    for i in range(concurrency - 1):
        arrivals[i] = time.perf_counter()
        engine.add(
            f"r{i}", random_prompt(model, prefill_len, i), SamplingParams.greedy(), frames + 1, sink_for(i)
        )
    if concurrency > 1:
        while min(counts[: concurrency - 1]) < 2:
            time.sleep(0.001)
    last = concurrency - 1
    arrivals[last] = time.perf_counter()
    engine.add(
        f"r{last}",
        random_prompt(model, prefill_len, last),
        SamplingParams.greedy(),
        frames + 1,
        sink_for(last),
    )
    done.wait()
    total = time.perf_counter() - t0
    engine.stop()
    per_request_fps = [frames / (total - (arrivals[i] - t0)) for i in range(concurrency)]
    # Steady state: all N requests decoding (after the last one's first frame, before any ends).
    window = (max(first.values()), min(ends))
    in_window = sum(1 for t in frame_times if window[0] < t <= window[1])
    steady = in_window / (window[1] - window[0]) if window[1] > window[0] and in_window else float("nan")
    return {
        "steady_state_aggregate_frames_per_s": steady,
        "concurrency": concurrency,
        "frames_total": sum(counts),
        "seconds": total,
        "aggregate_frames_per_s": sum(counts) / total,
        "per_request_frames_per_s_mean": statistics.mean(per_request_fps),
        "arrival_to_first_frame_ms_with_others_running": 1000 * (first[last] - arrivals[last]),
        "engine_steps": engine.steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0b6", choices=["0b6", "1b7"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=32, help="frames per request")
    ap.add_argument("--prefill-len", type=int, default=20)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=2, help="runs per configuration; the best is reported")
    ap.add_argument("--linear", default="auto", choices=LINEAR_CHOICES, help="the engine's --linear")
    ap.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES, help="the engine's flag")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype_name = resolve_dtype(
        args.dtype,
        "cpu",
        lambda: talker_step_probe(
            functools.partial(build_model, args.size),
            f"a decode step of a random {args.size} talker (--linear {args.linear} --quantization {args.quantization})",
            EngineConfig(linear=args.linear, quantization=args.quantization),
        ),
    )
    dtype = getattr(torch, dtype_name)
    concurrency = [int(x) for x in args.concurrency.split(",")]
    t0 = time.perf_counter()
    # Every compute runs off the main thread, in threads that exit, except the engine's loop: as
    # in the talker server (tts_common.compute_thread explains why it matters on CPU).
    model = call_in_fresh_thread(build_model, args.size, dtype)
    buckets = EngineConfig(max_slots=max(concurrency)).graph_buckets
    kernels, table = call_in_fresh_thread(
        set_up_linears, model.talker, "cpu", dtype, args.linear, args.quantization, buckets
    )
    weights = frame_weight_bytes(model.talker)
    bandwidth = read_bandwidth_gbs()
    floor_ms = 1000 * weights / (bandwidth * 1e9)
    print(f"{cpu_identity()}; linear kernels: {kernels}")
    if table is not None:
        print(table.describe())
    print(
        f"weights per frame {weights / 1e9:.2f} GB, read bandwidth {bandwidth:.1f} GB/s: floor {floor_ms:.1f} ms/frame"
    )
    print(
        f"built random {args.size} talker ({sum(t.numel() for t in model.talker.state_dict().values()) / 1e6:.0f} M "
        f"params) in {time.perf_counter() - t0:.1f} s; threads={args.threads} dtype={args.dtype} linear={args.linear}"
    )
    results: dict = {
        "size": args.size,
        "cpu_model": cpu_identity(),
        "dtype": dtype_name,
        "dtype_flag": args.dtype,
        "quantization": args.quantization,
        "kernels": kernels,
        "kernel_table": None if table is None else table.as_dict(),
        "frame_weight_bytes": weights,
        "read_bandwidth_gbs": round(bandwidth, 1),
        "floor_ms_per_frame": round(floor_ms, 1),
        "threads": args.threads,
        "frames": args.frames,
        "repeat": args.repeat,
        "linear": args.linear,
    }
    # Best of --repeat runs: on a shared machine interference only ever slows a run down.
    off = min(
        (
            call_in_fresh_thread(bench_offline, model, args.frames, args.prefill_len, args.linear)
            for _ in range(args.repeat)
        ),
        key=lambda r: r["ms_per_frame"],
    )
    off["vs_floor"] = round(off["ms_per_frame"] / floor_ms, 2)
    results["offline_batch1"] = off
    print(
        f"offline batch-1: {off['ms_per_frame']:.1f} ms/frame ({off['frames_per_s']:.2f} frames/s), "
        f"{off['vs_floor']:.2f}x the floor"
    )
    results["engine"] = []
    print(
        f"{'N':>3} {'agg frames/s (all)':>19} {'steady agg frames/s':>20} {'x offline b1':>13} "
        f"{'per-req frames/s':>17} {'TTFF new (ms)':>14}"
    )
    base = off["frames_per_s"]
    for n in concurrency:
        r = max(
            (bench_engine(model, n, args.frames, args.prefill_len, args.linear) for _ in range(args.repeat)),
            key=lambda r: r["steady_state_aggregate_frames_per_s"],
        )
        results["engine"].append(r)
        print(
            f"{n:>3} {r['aggregate_frames_per_s']:>19.2f} {r['steady_state_aggregate_frames_per_s']:>20.2f} "
            f"{r['steady_state_aggregate_frames_per_s'] / base:>13.2f} {r['per_request_frames_per_s_mean']:>17.2f} "
            f"{r['arrival_to_first_frame_ms_with_others_running']:>14.1f}"
        )
    kv = (
        2
        * model.config.model.talker.num_hidden_layers
        * model.config.model.talker.num_key_value_heads
        * model.config.model.talker.head_dim
        * torch.finfo(dtype).bits
        // 8
    )
    results["kv_bytes_per_position"] = kv
    print(f"talker KV per slot position: {kv} B ({kv * 2048 / 2**20:.0f} MiB per 2048-position slot)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
