"""Side by side in one process: the talker's decode step (talker + code predictor + greedy
sampling) at 1 row and at ``--batch`` rows for several precisions, taking turns (float32,
bfloat16, int8, float32, ...) so that load from other processes on a shared machine falls on all
of them alike, next to the read bandwidth measured in the same turns. Reports per precision the
median ms per step at 1 row against its floor (weight bytes one frame streams / read bandwidth)
and the frames/s at ``--batch`` against 1 row.

    python bench/talker_ab.py --model .bench-cpu-serving/random_0b6 --variants float32,auto,int8
    python bench/talker_ab.py --model .bench-cpu-serving/random_0b6 --variants int8-unfused,int8
    python bench/talker_ab.py --model .bench-cpu-serving/random_0b6 --variants int8,auto+int8

``int8`` is float32 activations over int8 weights, ``w8a8`` those weights with int8 activations
(per token); ``DTYPE+int8`` (``auto+int8``, ``bfloat16+w8a8``) the quantization under another
dtype, as ``--dtype DTYPE --quantization int8`` serves it (``auto`` resolved by the talker's
probe of the quantized step).

A variant with ``-unfused`` (``int8-unfused``, ``bfloat16-unfused``): the same kernels with the
decoder stacks on the torch path (no fused stack forward: tts_common.kernels.fused_stack), the
step as it ran before the fused stack.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from talker_bench import dtype_and_quantization, frame_weight_bytes, read_bandwidth_gbs

from talker_service.engine.config import EngineConfig
from talker_service.engine.dtype_probe import checkpoint_talker_probe, decode_step_runner
from talker_service.model.loader import TalkerModel
from tts_common.cpu_info import cpu_identity
from tts_common.kernels.choice import set_up_linears
from tts_common.precision import resolve_dtype


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument(
        "--variants",
        default="float32,auto,int8",
        help="dtypes (auto resolved), int8/w8a8 or DTYPE+int8/DTYPE+w8a8, each maybe -unfused",
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="decode steps per timing")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    buckets = sorted({1, 2, 4, opts.batch})
    runners, floors_bytes, kernels = {}, {}, {}
    for name in opts.variants.split(","):
        unfused = name.endswith("-unfused")
        base, quantization = dtype_and_quantization(name.removesuffix("-unfused"))
        probe = functools.partial(
            checkpoint_talker_probe, opts.model, EngineConfig(quantization=quantization)
        )
        dtype = resolve_dtype(base, "cpu", probe)
        model = TalkerModel.from_checkpoint(opts.model, "cpu", getattr(torch, dtype))
        kernels[name], _ = set_up_linears(model.talker, "cpu", model.dtype, "auto", quantization, buckets)
        if unfused:
            for stack in model.talker.modules():
                if (attribute := getattr(type(stack), "FUSED_STACK", None)) is not None:
                    setattr(stack, attribute, None)
            kernels[name] += " (fused stacks off)"
        floors_bytes[name] = frame_weight_bytes(model.talker)
        runners[name] = {b: decode_step_runner(model, b, opts.steps) for b in (1, opts.batch)}
        for run in runners[name].values():
            run()  # warm-up
        print(f"{name} ({dtype}): {kernels[name]}", flush=True)
    times: dict[str, dict[int, list[float]]] = {n: {1: [], opts.batch: []} for n in runners}
    bandwidth = []
    for turn in range(opts.turns):
        bandwidth.append(read_bandwidth_gbs(repeat=2))
        for name, by_batch in runners.items():
            for b, run in by_batch.items():
                t0 = time.perf_counter()
                run()
                times[name][b].append((time.perf_counter() - t0) / opts.steps)
        print(
            f"turn {turn}: read {bandwidth[-1]:.1f} GB/s, "
            + ", ".join(
                f"{n} {1000 * t[1][-1]:.0f}/{1000 * t[opts.batch][-1]:.0f} ms" for n, t in times.items()
            ),
            flush=True,
        )
    bw = statistics.median(bandwidth)
    report = {
        "cpu_model": cpu_identity(),
        "threads": torch.get_num_threads(),
        "read_gbs_median": round(bw, 1),
        "read_gbs_range": [round(min(bandwidth), 1), round(max(bandwidth), 1)],
        "variants": {},
    }
    for name, t in times.items():
        b1, bn = statistics.median(t[1]), statistics.median(t[opts.batch])
        floor = floors_bytes[name] / (bw * 1e9)
        report["variants"][name] = {
            "kernels": kernels[name],
            "ms_per_step_b1": round(1000 * b1, 1),
            "ms_per_step_b1_range": [round(1000 * min(t[1]), 1), round(1000 * max(t[1]), 1)],
            "floor_ms": round(1000 * floor, 1),
            "b1_vs_floor": round(b1 / floor, 2),
            f"frames_per_s_b{opts.batch}": round(opts.batch / bn, 2),
            "frames_per_s_b1": round(1 / b1, 2),
            f"b{opts.batch}_over_b1": round(opts.batch * b1 / bn, 2),
        }
    print(json.dumps(report, indent=2))
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
