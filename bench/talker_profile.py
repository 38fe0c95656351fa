"""Where a CPU decode step's time goes: one talker decode step (talker + code predictor +
sampling) at a batch of ``--batch`` rows under torch's profiler, with the engine's kernels
(``--linear auto``, ``--quantization``), on a checkpoint (e.g. a random one at the released
dimensions written by ``bench/cpu_serving.py --size 0b6``). Prints the ops by self CPU time, the
share of the linears, and the step's wall time at 1 row and at ``--batch`` (steps after a
warm-up; the cache is filled with a prompt of ``--prompt`` random positions per row).

    python bench/talker_profile.py --model .bench-cpu-serving/random_0b6 --dtype bfloat16 --batch 8
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from talker_service.engine.dtype_probe import decode_step_runner
from talker_service.model.loader import TalkerModel
from tts_common.cpu_info import cpu_identity
from tts_common.kernels.choice import set_up_linears
from tts_common.precision import LINEAR_CHOICES, QUANTIZATION_CHOICES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES, help="the engine's flag")
    ap.add_argument("--linear", default="auto", choices=LINEAR_CHOICES, help="the engine's --linear")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    opts = ap.parse_args()
    model = TalkerModel.from_checkpoint(opts.model, "cpu", getattr(torch, opts.dtype))
    kernels, _ = set_up_linears(
        model.talker, "cpu", model.dtype, opts.linear, opts.quantization, sorted({1, opts.batch})
    )
    print(f"{cpu_identity()}, {torch.get_num_threads()} threads; {kernels}")
    walls = {}
    for batch in sorted({1, opts.batch}):
        run = decode_step_runner(model, batch, opts.steps, opts.prompt)
        run()  # warm-up
        t0 = time.perf_counter()
        run()
        walls[batch] = (time.perf_counter() - t0) / opts.steps
        print(f"batch {batch}: {1000 * walls[batch]:.1f} ms per step, {batch / walls[batch]:.2f} frames/s")
    print(f"b{opts.batch}/b1 frames/s: {opts.batch * walls[1] / walls[opts.batch]:.2f}")
    run = decode_step_runner(model, opts.batch, opts.steps, opts.prompt)
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(events.table(sort_by="self_cpu_time_total", row_limit=opts.top))
    kernels_us = sum(
        e.self_cpu_time_total
        for e in events
        if e.key.startswith(("mkldnn::", "aten::linear", "aten::addmm", "aten::mm", "aten::_weight_int8pack"))
    )
    print(
        f"library linear ops: {100 * kernels_us / max(total, 1):.0f}% of self CPU time (our GEMV runs outside the profiler's ops: see the rest)"
    )


if __name__ == "__main__":
    main()
