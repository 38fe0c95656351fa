"""CPU serving, in one run: our stack vs the offline in-process pipeline vs the official
implementation (when ``qwen_tts`` is importable), for each dtype, on one checkpoint.

For every ``--dtypes`` entry (default ``float32,auto,int8``; ``auto`` resolved as the stages
resolve it, by measuring each stage's step, so the talker and the decoder may differ; ``int8`` = float32 with ``--quantization int8``; ``<dtype>+int8``
that dtype with ``--quantization int8``, e.g. ``auto+int8``: int8 weights, the activations and
the decoder in the ``auto`` dtype; ``w8a8`` and ``<dtype>+w8a8`` likewise with ``--quantization
w8a8``):

* offline: ``qwen3_tts.offline.OfflineSynthesizer`` (the same engine and decoder in this
  process), its linear kernels chosen first for batches up to ``--batch`` (the kernel table is
  reported): one request: RTF, and the talker's ms per frame against the read-bandwidth floor
  of the dtype (weights one frame must stream: the talker once, the code predictor 15 times);
  ``--batch`` requests at once: the talker's frames/s against one request's (talker figures:
  the median of ``--repeats`` timings, each listed); the decoder's CPU milliseconds per frame
  (process CPU time while it decodes);
* stack (unless ``--skip-stack``): the four processes of ``qwen3-tts up`` (same flags and environment: all cores per stage,
  passive OpenMP waiting), stage dtypes set through ``QWEN3TTS_<STAGE>_DTYPE``; resident memory of each
  process at idle and after load; one stream (RTF, time to first audio); then closed-loop
  concurrency 1, 2, 4, ... (``--concurrency``): aggregate audio seconds per second, playback
  underruns, CPU per frame of each stage; the largest concurrency with zero underruns;
* official: ``qwen_tts.Qwen3TTSModel`` on the same checkpoint, one request and a batch of 8
  (skipped, with the reason, when not installed or when its call fails).

The report starts with the machine: CPU model, the flags that matter (AVX2, AVX-512, BF16, AMX),
cores, memory, the measured copy and read bandwidths (a torch copy and a sum of a buffer far
larger than the caches), the dense-product ceiling (GFLOP/s of a large matrix product) and what
the talker's linear kernel reaches at 1 and 8 rows. Each concurrency level also reports the CPU
milliseconds every stage process spent per frame of audio (gRPC included) and how busy they kept
the machine.

    python bench/cpu_serving.py --size 0b6 --json bench/results/cpu_serving_0b6.json
    python bench/cpu_serving.py --model .dev-model/custom_voice --concurrency 1,2 \\
        --max-new-tokens 24 --requests-per-level 2           # a smoke run on the dev checkpoint

``--size 0b6`` writes a random checkpoint at the released 0.6B dimensions (a few GB, once) under
``--work-dir``. Traffic goes only to loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/load.py: the load generator

import load
from decoder_bench import attainable_gflops, best_time
from talker_bench import dtype_and_quantization, frame_weight_bytes, read_bandwidth_gbs

from decoder_service.model.dtype_probe import checkpoint_decoder_probe
from qwen3_tts.dev_model import SIZES, make_dev_model
from qwen3_tts.local_stack import (
    StageProcess,
    on_free_ports,
    stage_commands,
    stage_environment,
    start_logged,
    stop_all,
    wait_until_serving,
)
from qwen3_tts.offline import OfflineRequest, OfflineSynthesizer
from talker_service.engine import EngineConfig
from talker_service.engine.dtype_probe import checkpoint_talker_probe
from tts_common.config import load_checkpoint_config
from tts_common.cpu_info import cpu_flags, cpu_identity
from tts_common.kernels.choice import set_up_linears
from tts_common.memory import resident_bytes
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc
from tts_common.precision import resolve_dtype

FRAME_RATE = 12.5
INTERESTING_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "bf16")
TEXT = "The quick brown fox jumps over the lazy dog, and streaming speech should never stutter."
OFFICIAL_BATCH = 8
SHORT_TOKENS = 3
"""Frames + 1 of the short run the per-frame figures subtract."""


# ---------------------------------------------------------------------------------------------
# The machine


def memory_bandwidth(mib: int = 1024, repeat: int = 5) -> dict[str, float]:
    """Best-of-``repeat`` bandwidths in GB/s over a ``mib`` MiB buffer: ``copy`` (bytes read +
    written by a copy) and ``read`` (a sum: bytes read). Weights are only read, so ``read`` is
    the one a decode step's floor is measured against."""
    read = read_bandwidth_gbs(mib, repeat)  # its buffer freed before the copy's two
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    return {
        "copy": round(2 * nbytes / best_time(lambda: dst.copy_(src), repeat) / 1e9, 2),
        "read": round(read, 2),
    }


def linear_gflops(rows: tuple[int, ...] = (1, 8), layers: int = 30) -> dict[int, float]:
    """GFLOP/s of the talker's linear kernel (pre-packed oneDNN when available, else torch's) on
    a 1024 -> 3072 layer at a few row counts (a decode step's batch), over ``layers`` distinct
    weights (360 MB at 30: not in any cache, as in a step). Set against the dense ceiling, it
    says how far small batches are from what the machine computes."""
    from tts_common.onednn_linear import OneDnnLinear, onednn_linear_available

    dense = [torch.nn.Linear(1024, 3072, bias=False) for _ in range(layers)]
    modules: list[torch.nn.Module] = (
        [OneDnnLinear(layer) for layer in dense] if onednn_linear_available() else list(dense)
    )
    out = {}
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, 1024)

            def step(x: torch.Tensor = x) -> None:
                for m in modules:
                    m(x)

            out[n] = round(2 * n * 1024 * 3072 * layers / best_time(step) / 1e9, 1)
    return out


def machine_info(bandwidth_mib: int) -> dict[str, Any]:
    flags = cpu_flags()
    total = next(
        (int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:")), 0
    )
    return {
        "cpu_model": cpu_identity(),
        "cpu_flags": [f for f in INTERESTING_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(total / 2**30, 1),
        "memory_bandwidth_gbs": memory_bandwidth(bandwidth_mib),
        "dense_gflops": round(attainable_gflops(torch.get_num_threads()), 1),
        "talker_linear_gflops_by_rows": linear_gflops(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


# ---------------------------------------------------------------------------------------------
# Offline, in this process


def _talker_and_decode(
    synth: OfflineSynthesizer, requests: list[OfflineRequest], sampling: tts_pb2.SamplingOptions
) -> tuple[int, float, float, float, float]:
    """Frames, wall seconds of the whole call, wall and CPU seconds its decoding took (timed
    inside the call: decoding the codes again in a second call made the talker's share, the
    difference, swing with the decoder's own run-to-run noise), and seconds of audio."""
    decode = synth.decoder.decode_utterances
    spent = [0.0, 0.0]

    def timed_decode(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return decode(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += time.process_time() - c0

    synth.decoder.decode_utterances = timed_decode  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        results = synth.synthesize(requests, sampling)
        seconds = time.perf_counter() - t0
    finally:
        del synth.decoder.decode_utterances  # the class's method again
    audio_s = sum(len(r.wav) for r in results) / synth.sample_rate
    return sum(len(r.codes) for r in results), seconds, spent[0], spent[1], audio_s


def talker_seconds_per_frame(
    synth: OfflineSynthesizer,
    requests: list[OfflineRequest],
    sampling: tts_pb2.SamplingOptions,
    short: tts_pb2.SamplingOptions,
    repeats: int = 3,
) -> list[float]:
    """The talker's seconds per step, once per repeat: (a long run - a short run) / the frames
    between, each without its decoding (load, prompts and prefill cancel out)."""
    out = []
    for _ in range(repeats):
        n_long, s_long, d_long, _, _ = _talker_and_decode(synth, requests, sampling)
        n_short, s_short, d_short, _, _ = _talker_and_decode(synth, requests, short)
        steps = (n_long - n_short) / len(requests)
        out.append(((s_long - d_long) - (s_short - d_short)) / max(steps, 1))
    return out


@dataclasses.dataclass(frozen=True)
class RunDtypes:
    """The dtypes of one run: ``--dtypes`` entry ``requested`` as each stage resolves it (on CPU
    ``auto`` is timed per stage, so the talker and the decoder may differ)."""

    requested: str
    talker: str
    decoder: str

    @property
    def label(self) -> str:
        return self.talker if self.talker == self.decoder else f"talker-{self.talker}-decoder-{self.decoder}"

    @classmethod
    def resolve(cls, requested: str, model: Path, quantization: str) -> RunDtypes:
        engine = EngineConfig(quantization=quantization)
        talker = resolve_dtype(requested, "cpu", functools.partial(checkpoint_talker_probe, model, engine))
        decoder = resolve_dtype(requested, "cpu", functools.partial(checkpoint_decoder_probe, model))
        return cls(requested, talker, decoder)


def bench_offline(
    model: Path,
    dtypes: RunDtypes,
    quantization: str,
    speaker: str,
    max_new_tokens: int,
    bandwidth_gbs: float,
    batch: int,
    repeats: int = 3,
) -> dict:
    # All ``batch`` requests in one engine batch (the synthesizer's default runs 4 at a time).
    synth = OfflineSynthesizer(
        model,
        "cpu",
        getattr(torch, dtypes.talker),
        max_batch=batch,
        decoder_dtype=getattr(torch, dtypes.decoder),
    )
    buckets = [b for b in (1, 2, 4, 8, 16, 32) if b < batch] + [batch]
    kernels, table = set_up_linears(
        synth.talker.talker, "cpu", synth.talker.dtype, "auto", quantization, buckets
    )
    print(f"  linear kernels: {kernels}", flush=True)
    if table is not None:
        print(table.describe(), flush=True)
    request = OfflineRequest(id="offline", text=TEXT, language="english", speaker=speaker)
    sampling = tts_pb2.SamplingOptions(seed=1, max_new_tokens=max_new_tokens)
    short = tts_pb2.SamplingOptions(seed=1, max_new_tokens=SHORT_TOKENS)
    synth.synthesize([request], short)  # warm-up
    frames, seconds, decode_s, decode_cpu, audio_s = _talker_and_decode(synth, [request], sampling)
    weights = frame_weight_bytes(synth.talker.talker)
    out: dict[str, Any] = {
        "kernels": kernels,
        "kernel_table": None if table is None else table.as_dict(),
        "frames": frames,
        "seconds": round(seconds, 3),
        "rtf": round(seconds / audio_s, 3) if audio_s else None,
        "ms_per_frame_incl_decode": round(1000 * seconds / max(frames, 1), 1),
        "frame_weight_bytes": weights,
        "bandwidth_floor_ms_per_frame": round(1000 * weights / (bandwidth_gbs * 1e9), 1),
        "decode_seconds": round(decode_s, 3),
        "decoder_cpu_ms_per_frame": round(1000 * decode_cpu / max(frames, 1), 1),
    }

    # The median of ``repeats`` (each run listed): on a shared host one run can be 20-40% off.
    steps_1 = talker_seconds_per_frame(synth, [request], sampling, short, repeats)
    step_1 = statistics.median(steps_1)
    out["talker_ms_per_frame"] = round(1000 * step_1, 1)
    out["talker_ms_per_frame_runs"] = [round(1000 * s, 1) for s in steps_1]
    out["talker_vs_floor"] = round(
        out["talker_ms_per_frame"] / max(out["bandwidth_floor_ms_per_frame"], 1e-9), 2
    )
    if batch > 1:
        many = [dataclasses.replace(request, id=f"offline-{i}") for i in range(batch)]
        steps_b = talker_seconds_per_frame(synth, many, sampling, short, repeats)
        step_b = statistics.median(steps_b)
        out["talker_frames_per_s_b1"] = round(1 / step_1, 2)
        out[f"talker_frames_per_s_b{batch}"] = round(batch / step_b, 2)
        out[f"talker_frames_per_s_b{batch}_runs"] = [round(batch / s, 2) for s in steps_b]
        out[f"b{batch}_over_b1"] = round(batch * step_1 / step_b, 2)
    del synth
    gc.collect()
    return out


# ---------------------------------------------------------------------------------------------
# The stack


@contextlib.contextmanager
def running_stack(model: Path, dtypes: RunDtypes, quantization: str, max_slots: int, log_dir: Path):
    """The four processes of ``qwen3-tts up`` on free loopback ports (the gateway's HTTP API too,
    clear of a running ``qwen3-tts up``), SERVING; stopped on exit."""
    stages = stage_commands(model, "127.0.0.1", 0, 0, "cpu", False)
    on_free_ports(stages)
    env = stage_environment(os.environ) | {
        "QWEN3TTS_DTYPE": dtypes.requested,  # the speaker stage resolves its own
        "QWEN3TTS_TALKER_DTYPE": dtypes.talker,
        "QWEN3TTS_DECODER_DTYPE": dtypes.decoder,
        "QWEN3TTS_TALKER_QUANTIZATION": quantization,
        "QWEN3TTS_TALKER_MAX_SLOTS": str(max_slots),
        "QWEN3TTS_GATEWAY_MAX_CONCURRENT_STREAMS": str(max(64, 2 * max_slots)),
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for stage in stages:
            log = log_dir / f"{stage.name}-{dtypes.label}.log"
            log.unlink(missing_ok=True)  # this run's output only
            start_logged(stage, log, env)
        wait_until_serving(stages, timeout=1200)
        yield stages
    finally:
        stop_all(stages, grace=20)


def resident(stages: list[StageProcess]) -> dict[str, float]:
    """Resident MiB per process."""
    return {
        s.name: round(resident_bytes(s.process.pid) / 2**20, 1)
        for s in stages
        if s.process is not None and s.process.poll() is None
    }


def load_args(
    gateway: str, speaker: str, max_new_tokens: int, concurrency: int, requests: int
) -> argparse.Namespace:
    """A closed-loop ``bench/load.py`` run of ``requests`` requests, ``concurrency`` at a time."""
    return load.parse_args(
        [
            *("--gateway", gateway, "--mode", "closed", "--concurrency", str(concurrency)),
            *("--requests", str(requests), "--speaker", speaker, "--language", "english"),
            *("--max-new-tokens", str(max_new_tokens), "--deadline", "1800", "--seed", str(concurrency)),
        ]
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(args: argparse.Namespace, stages: list[StageProcess]) -> dict[str, Any]:
    """One closed-loop level, with the CPU each stage process spent on it: per frame of audio
    sent (what a frame costs a stage, gRPC included) and the share of the machine all of them
    kept busy (near 1: the level is bound by compute, not by waiting between stages)."""
    running = [s for s in stages if s.process is not None]
    before = {s.name: cpu_seconds(s.process.pid) for s in running}  # type: ignore[union-attr]
    report, _ = asyncio.run(load.run(args))
    spent = {s.name: cpu_seconds(s.process.pid) - before[s.name] for s in running}  # type: ignore[union-attr]
    frames = report.audio_seconds_per_second * report.wall_s * FRAME_RATE
    return {
        "concurrency": args.concurrency,
        "requests": report.requests,
        "by_status": report.by_status,
        "rtf_mean": round(report.rtf_mean, 3),
        "ttfa_ms": {k: round(v, 1) for k, v in report.ttfa_ms.items()},
        "audio_seconds_per_second": round(report.audio_seconds_per_second, 3),
        "underrun_requests": report.underrun_requests,
        "underruns_total": report.underruns_total,
        "cpu_ms_per_frame": {k: round(1000 * v / frames, 1) for k, v in spent.items()} if frames else {},
        "machine_busy": round(sum(spent.values()) / (report.wall_s * (os.cpu_count() or 1)), 2),
    }


async def _warm(gateway: str, speaker: str) -> None:
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        await load.one_request(stub, load_args(gateway, speaker, 4, 1, 1), random.Random(0))


def bench_stack(
    model: Path, dtypes: RunDtypes, quantization: str, speaker: str, opts: argparse.Namespace
) -> dict[str, Any]:
    ladder = [int(c) for c in opts.concurrency.split(",")]
    with running_stack(model, dtypes, quantization, max(ladder), opts.work_dir / "logs") as stages:
        gateway = next(s for s in stages if s.name == "gateway").address
        time.sleep(2.0)  # let start-up allocations settle before the idle figure
        out: dict[str, Any] = {"resident_mib_idle": resident(stages)}
        asyncio.run(_warm(gateway, speaker))
        out["single_stream"] = run_load(
            load_args(gateway, speaker, opts.max_new_tokens, 1, opts.single_requests), stages
        )
        levels = []
        for c in ladder:
            levels.append(
                run_load(
                    load_args(gateway, speaker, opts.max_new_tokens, c, c * opts.requests_per_level), stages
                )
            )
            print(f"  [{dtypes.label}] concurrency {c}: {levels[-1]}", flush=True)
        out["levels"] = levels
        realtime = [
            lv["concurrency"]
            for lv in levels
            if lv["underrun_requests"] == 0 and lv["by_status"] == {"OK": lv["requests"]}
        ]
        out["max_realtime_concurrency"] = max(realtime, default=0)
        out["resident_mib_after_load"] = resident(stages)
        talker_log = (opts.work_dir / "logs" / f"talker-{dtypes.label}.log").read_text(errors="replace")
        for key, marker in (("kv_cache", "KV cache:"), ("linear_kernels", "linear kernels:")):
            out[key] = next(
                (ln.split(marker, 1)[1].strip() for ln in talker_log.splitlines() if marker in ln), None
            )
    return out


# ---------------------------------------------------------------------------------------------
# The official implementation


def bench_official(
    model: Path, dtype: str, speaker: str, max_new_tokens: int, python: Path | None = None
) -> dict[str, Any]:
    """``qwen_tts`` on the same checkpoint, one request and a batch of 8 (``official_tts.py``):
    in this process, or, with ``python`` (the interpreter of an environment where qwen_tts is
    installed, e.g. ``VENV/bin/python`` of a venv with ``qwen-tts==0.1.1``), in a child process
    of it. Any failure is reported, not raised."""
    import official_tts

    if python is None:
        return official_tts.bench(model, dtype, speaker, max_new_tokens, TEXT, OFFICIAL_BATCH)
    args = [str(python), str(Path(official_tts.__file__)), str(model), dtype, speaker]
    args += [str(max_new_tokens), TEXT, str(OFFICIAL_BATCH)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="a CustomVoice checkpoint directory")
    src.add_argument("--size", choices=SIZES, default="0b6", help="random checkpoint at this size")
    ap.add_argument("--work-dir", type=Path, default=Path(".bench-cpu-serving"))
    ap.add_argument(
        "--dtypes",
        default="float32,auto,int8",
        help="float32, bfloat16, auto; int8 (w8a8) = float32 with that quantization; <dtype>+int8 (+w8a8): that dtype, quantized",
    )
    ap.add_argument("--batch", type=int, default=8, help="offline: requests at once against one")
    ap.add_argument("--repeats", type=int, default=3, help="offline: talker timings per figure (median)")
    ap.add_argument("--skip-stack", action="store_true", help="offline figures only")
    ap.add_argument("--speaker", default="ryan")
    ap.add_argument("--max-new-tokens", type=int, default=121, help="frames per request + 1 (~10 s)")
    ap.add_argument("--concurrency", default="1,2,4,8", help="closed-loop levels")
    ap.add_argument("--requests-per-level", type=int, default=2, help="requests per stream at a level")
    ap.add_argument("--single-requests", type=int, default=3)
    ap.add_argument("--bandwidth-mib", type=int, default=1024)
    ap.add_argument("--skip-official", action="store_true")
    ap.add_argument(
        "--official-python",
        type=Path,
        help="run qwen_tts with this interpreter (its own environment) instead of in this process",
    )
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()

    model = opts.model
    if model is None:
        model = make_dev_model(
            opts.work_dir / f"random_{opts.size}", "custom_voice", if_missing=True, size=opts.size
        )
    cfg = load_checkpoint_config(model)
    report: dict[str, Any] = {
        "machine": machine_info(opts.bandwidth_mib),
        "checkpoint": {
            "path": str(model),
            "size": cfg.model.tts_model_size,
            "type": cfg.model.tts_model_type,
        },
        "settings": {k: str(v) for k, v in vars(opts).items()},
        "runs": {},
    }
    print(json.dumps(report["machine"], indent=2), flush=True)
    measured: dict[tuple[str, str, str], str] = {}
    for name in opts.dtypes.split(","):
        try:
            base, quantization = dtype_and_quantization(name)
        except ValueError as exc:
            ap.error(f"--dtypes {exc}")
        dtypes = RunDtypes.resolve(base, model, quantization)
        print(f"== --dtype {name} ({dtypes.label}, quantization {quantization})", flush=True)
        described = {"dtype": dtypes.talker, "decoder_dtype": dtypes.decoder}
        key = (dtypes.talker, dtypes.decoder, quantization)
        if key in measured:  # e.g. auto measured float32: float32 again
            report["runs"][name] = described | {"same_as": measured[key]}
            continue
        measured[key] = name
        run: dict[str, Any] = described | {"quantization": quantization}
        run["offline"] = bench_offline(
            model,
            dtypes,
            quantization,
            opts.speaker,
            opts.max_new_tokens,
            report["machine"]["memory_bandwidth_gbs"]["read"],
            opts.batch,
            opts.repeats,
        )
        print(f"  offline: {run['offline']}", flush=True)
        if not opts.skip_stack:
            run["stack"] = bench_stack(model, dtypes, quantization, opts.speaker, opts)
            single = run["stack"]["single_stream"]
            if single["rtf_mean"] and run["offline"]["rtf"]:
                run["stack_over_offline_rtf"] = round(single["rtf_mean"] / run["offline"]["rtf"], 2)
        if not opts.skip_official and dtypes.label == "float32" and quantization == "none":
            run["official"] = bench_official(
                model, "float32", opts.speaker, opts.max_new_tokens, opts.official_python
            )
        report["runs"][name] = run
        print(json.dumps(run, indent=2), flush=True)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
