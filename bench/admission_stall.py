"""Admission stall: the gap between consecutive frames of running streams while newcomers arrive.

8 streams run (steady state); then 16 new requests arrive at once (short, streamed-text-sized
prompts). Every admission is a prefill the running streams wait for; the engine bounds them per
iteration (tokens and, since issue 25, requests). Measured on the engine in-process (random
weights, fixed-length runs: the EOS logit is zeroed):

* steady gap: p50 of the running streams' frame gaps before the arrivals (batch 8) and after
  every newcomer is in (batch 24);
* stall window: every gap of the running streams from the arrivals until each newcomer has its
  first frame: p50, p99 and max, and p99 / steady gap (the goal: at most 2x);
* the newcomers' side: the time from their arrival to their first frame (p50 and max).

``--prefill-cost`` times the prefill of 1-16 such prompts together and one at a time instead
(needs a checkout whose ``TalkerRunner.prefill`` takes a group).

The script runs against whichever code it imports, so BEFORE/AFTER compare two checkouts side
by side in one session, e.g.::

    PYTHONPATH=/path/to/a/checkout/of/main python bench/admission_stall.py --json before.json  # main
    PYTHONPATH=. python bench/admission_stall.py --json after.json                             # this one

(without PYTHONPATH a script path imports the installed package; ``python -m`` from a checkout
imports that checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/talker_bench.py: the random talker

from talker_bench import build_model, random_prompt

import talker_service
from talker_service.engine import EngineConfig, FrameEvent, TalkerEngine
from tts_common.synthesis import SamplingParams


class Stream:
    """Frame arrival times of one request."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.first = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, FrameEvent):
            self.times.append(time.monotonic())
            self.first.set()


def gaps(streams: list[Stream], start: float, end: float) -> list[float]:
    """Gaps (s) between consecutive frames of ``streams`` whose later frame lies in [start, end]."""
    out = []
    for s in streams:
        out += [b - a for a, b in zip(s.times, s.times[1:]) if start <= b <= end]
    return out


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    model = build_model(args.size, torch.float32)
    config = EngineConfig(
        max_slots=args.running + args.arrivals, max_seq_len=args.max_seq_len, max_waiting=256
    )
    if args.max_prefills_per_step and hasattr(config, "max_prefills_per_step"):
        config = dataclasses.replace(config, max_prefills_per_step=args.max_prefills_per_step)
    sampling = SamplingParams()  # the checkpoint default: sampled (Gumbel noise) at both stages
    running = [Stream() for _ in range(args.running)]
    newcomers = [Stream() for _ in range(args.arrivals)]
    with TalkerEngine(model, config) as engine:
        for i, sink in enumerate(running):
            engine.add(
                f"run{i}",
                random_prompt(model, args.prompt_len, i),
                dataclasses.replace(sampling, seed=i),
                args.max_seq_len - args.prompt_len - 2,
                sink,
            )
        while min(len(s.times) for s in running) < args.warm_frames:
            time.sleep(0.005)
        t_steady = time.monotonic()
        while min(len(s.times) for s in running) < args.warm_frames + args.steady_frames:
            time.sleep(0.005)
        t_arrive = time.monotonic()
        for i, sink in enumerate(newcomers):
            engine.add(
                f"new{i}",
                random_prompt(model, args.prompt_len, 100 + i),
                dataclasses.replace(sampling, seed=100 + i),
                args.new_frames,
                sink,
            )
        for s in newcomers:
            s.first.wait(600)
        t_in = time.monotonic()
        first_frames = sorted(s.times[0] - t_arrive for s in newcomers)
        marks = [len(s.times) for s in running]
        while min(len(s.times) - m for s, m in zip(running, marks)) < args.steady_frames:
            time.sleep(0.005)
        t_end = time.monotonic()
        steps = engine.steps
    before = gaps(running, t_steady, t_arrive)
    window = gaps(running, t_arrive, t_in)
    after = gaps(running, t_in, t_end)
    steady8, steady_all = statistics.median(before), statistics.median(after)
    return {
        "code": str(Path(talker_service.__file__).parent.parent),
        "size": args.size,
        "threads": args.threads,
        "max_prefills_per_step": getattr(config, "max_prefills_per_step", None),
        "steady_gap_ms_batch_running": round(steady8 * 1000, 2),
        "steady_gap_ms_batch_all": round(steady_all * 1000, 2),
        "window_ms": round((t_in - t_arrive) * 1000, 1),
        "window_gaps": len(window),
        "window_gap_p50_ms": round(p(window, 0.5) * 1000, 2),
        "window_gap_p99_ms": round(p(window, 0.99) * 1000, 2),
        "window_gap_max_ms": round(max(window) * 1000, 2),
        "p99_over_steady_running": round(p(window, 0.99) / steady8, 2),
        "p99_over_steady_all": round(p(window, 0.99) / steady_all, 2),
        "newcomer_first_frame_ms_p50": round(p(first_frames, 0.5) * 1000, 1),
        "newcomer_first_frame_ms_max": round(first_frames[-1] * 1000, 1),
        "engine_steps": steps,
    }


def prefill_cost(args: argparse.Namespace) -> dict[str, object]:
    """``--prefill-cost``: milliseconds to prefill k prompts of ``--prompt-len`` positions
    together (``TalkerRunner.prefill`` of the group) and one at a time, best of ``--repeat``
    (alternating), beside one decode step of ``--running`` rows: what an iteration admitting k
    newcomers adds to every running stream's frame gap."""
    from talker_service.engine.request import EngineRequest
    from talker_service.engine.runner import TalkerRunner
    from tts_common.kernels.choice import set_up_linears

    torch.set_num_threads(args.threads)
    model = build_model(args.size, torch.float32)
    ks = (1, 2, 4, 8, 16)
    config = EngineConfig(max_slots=args.running + max(ks), max_seq_len=args.max_seq_len)
    kernels, _ = set_up_linears(model.talker, model.device, model.dtype, "auto", "none", config.graph_buckets)
    runner = TalkerRunner(model.talker, config)

    def requests(k: int, first_slot: int) -> list[EngineRequest]:
        out = []
        for i in range(k):
            r = EngineRequest(f"r{i}", None, SamplingParams(seed=i), None, lambda e: None)  # type: ignore[arg-type]
            r.prompt, r.slot, r.max_frames = random_prompt(model, args.prompt_len, i), first_slot + i, 8
            out.append(r)
        return out

    def ms(groups: list[list[EngineRequest]]) -> float:
        t0 = time.perf_counter()
        for group in groups:
            runner.prefill(group)
        return (time.perf_counter() - t0) * 1000

    running = requests(args.running, 0)
    runner.prefill(running)
    runner.prefill(requests(max(ks), args.running))  # first touch of every slot's KV pages
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        runner.step(running)
        t = (time.perf_counter() - t0) * 1000
        best["decode_step"] = min(best.get("decode_step", t), t)
        for k in ks:
            t = ms([requests(k, args.running)])
            best[f"together_{k}"] = min(best.get(f"together_{k}", t), t)
            t = ms([[r] for r in requests(k, args.running)])
            best[f"one_at_a_time_{k}"] = min(best.get(f"one_at_a_time_{k}", t), t)
    return {
        "code": str(Path(talker_service.__file__).parent.parent),
        "size": args.size,
        "threads": args.threads,
        "kernels": kernels,
        "prompt_len": args.prompt_len,
        f"decode_step_ms_batch_{args.running}": round(best["decode_step"], 1),
        "prefill_ms": {
            str(k): {
                "together": round(best[f"together_{k}"], 1),
                "one_at_a_time": round(best[f"one_at_a_time_{k}"], 1),
            }
            for k in ks
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="dev", choices=["dev", "0b6", "1b7"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--running", type=int, default=8)
    ap.add_argument("--arrivals", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=12, help="prompt positions (streamed text starts ~10)")
    ap.add_argument("--new-frames", type=int, default=60)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--warm-frames", type=int, default=5)
    ap.add_argument("--steady-frames", type=int, default=10)
    ap.add_argument("--max-prefills-per-step", type=int, default=0, help="0: the engine's default")
    ap.add_argument("--prefill-cost", action="store_true", help="time prefills of 1-16 prompts instead")
    ap.add_argument("--repeat", type=int, default=3, help="--prefill-cost: best of this many")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = prefill_cost(args) if args.prefill_cost else run(args)
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
