"""Decoder CPU cost per frame, two source trees side by side (A/B interleaved in one process).

The streamed decode at the release dimensions (random weights, same seed for every tree) with the
serving chunk schedule (2, 4, 8, 16, 25, ... frames), for one stream alone and for ``--streams``
streams advanced together (``advance_sessions``): wall ms and process CPU ms (all threads,
spinning included) per decoded frame. Each tree's ``decoder_service`` package is imported in turn
into this process (``tts_common`` comes from the first tree: the trees must not differ there);
the trees then alternate run by run for ``--rounds`` rounds, so that a busy spell on a shared
machine hits both alike; the minimum and the median over the rounds are reported. The run also
checks that every tree decodes the same audio as the first one (max abs difference).

Example (figures in bench/results/decoder_cpu.json; ``/tmp/base`` holds ``git archive main``):
    OMP_WAIT_POLICY=PASSIVE python bench/decoder_cpu.py --tree main=/tmp/base --tree branch=. \\
        --threads 2 --frames 50 --streams 8 --rounds 5 --json bench/results/decoder_cpu.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from tts_common.cpu_info import cpu_identity
from tts_common.release_dims import release_decoder_config

PACKAGE = "decoder_service"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def import_tree(path: Path) -> dict[str, ModuleType]:
    """``decoder_service``'s decoder, random_init and streaming modules from the tree at ``path``."""
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    sys.path.insert(0, str(path.resolve()))
    try:
        mods = {
            short: importlib.import_module(f"{PACKAGE}.model.{short}")
            for short in ("decoder", "random_init", "streaming")
        }
    finally:
        sys.path.pop(0)
    origin = Path(mods["decoder"].__file__ or "").resolve()
    if path.resolve() not in origin.parents:
        raise RuntimeError(f"{PACKAGE} came from {origin}, not from {path}")
    return mods


class Tree:
    """One tree's decoder (release dims, random weights) and its streaming entry points."""

    def __init__(self, name: str, path: Path, dtype: torch.dtype) -> None:
        self.name = name
        mods = import_tree(path)
        dec = mods["decoder"].CodecDecoder(release_decoder_config())
        self.decoder = mods["random_init"].init_random_weights(dec, seed=0).to(dtype).eval()
        self.streaming = mods["streaming"]

    def run(self, streams: list[torch.Tensor]) -> tuple[float, float, torch.Tensor]:
        """(wall s, CPU s, first stream's audio) of streaming ``streams`` together."""
        st = self.streaming
        sessions = [st.DecoderSession(self.decoder) for _ in streams]
        frames = int(streams[0].shape[0])
        outs: list[torch.Tensor] = []
        w0, c0 = time.perf_counter(), time.process_time()
        i = 0
        for n in st.ChunkSchedule().split(frames):
            outs.append(st.advance_sessions(sessions, [s[i : i + n] for s in streams])[0])
            i += n
        return time.perf_counter() - w0, time.process_time() - c0, torch.cat(outs)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tree",
        action="append",
        default=[],
        help="NAME=PATH[:DTYPE] of a source tree (2 or more; DTYPE float32 or bfloat16, default --dtype)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=50, help="frames per stream (12.5 frames/s)")
    p.add_argument("--streams", type=int, default=8, help="streams advanced together in the batched run")
    p.add_argument("--rounds", type=int, default=5, help="alternations of the trees")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="default dtype of the trees")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    trees_arg = dict(t.split("=", 1) for t in args.tree)
    if len(trees_arg) < 2:
        p.error("give at least two --tree NAME=PATH[:DTYPE]")
    torch.set_num_threads(args.threads)
    trees: list[Tree] = []
    for name, spec in trees_arg.items():
        path, _, dtype_name = spec.partition(":")
        if (dtype_name or args.dtype) not in DTYPES:
            p.error(f"unknown dtype in --tree {name}={spec}")
        trees.append(Tree(name, Path(path), DTYPES[dtype_name or args.dtype]))
    codebook = trees[0].decoder.config.codebook_size
    quantizers = trees[0].decoder.num_quantizers
    gen = torch.Generator().manual_seed(1)
    streams = [
        torch.randint(0, codebook, (args.frames, quantizers), generator=gen) for _ in range(args.streams)
    ]
    cases = {"streams_1": streams[:1], f"streams_{args.streams}": streams}
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {t.name: {c: [] for c in cases} for t in trees}
    audio: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for t in trees:  # warm-up: oneDNN primitives, packed weights, allocator
            audio[t.name] = t.run(streams[:1])[2].float()
        for r in range(args.rounds):
            for case, group in cases.items():
                for t in trees if r % 2 == 0 else trees[::-1]:
                    wall, cpu, _ = t.run(group)
                    total = len(group) * args.frames
                    runs[t.name][case].append((1000 * wall / total, 1000 * cpu / total))
                    print(
                        f"round {r} {t.name:>8} {case:>10}: wall {runs[t.name][case][-1][0]:6.1f} "
                        f"cpu {runs[t.name][case][-1][1]:6.1f} ms/frame",
                        flush=True,
                    )

    def summary(xs: list[tuple[float, float]]) -> dict[str, float]:
        walls, cpus = [x[0] for x in xs], [x[1] for x in xs]
        return {
            "wall_ms_per_frame_min": round(min(walls), 2),
            "wall_ms_per_frame_median": round(statistics.median(walls), 2),
            "cpu_ms_per_frame_min": round(min(cpus), 2),
            "cpu_ms_per_frame_median": round(statistics.median(cpus), 2),
        }

    ref = audio[trees[0].name]
    result: dict[str, Any] = {
        "what": "streamed codec decode at release dims (random weights), serving chunk schedule "
        "2,4,8,16,25..., ms per decoded frame (80 ms of audio); trees interleaved run by run",
        "machine": {
            "cpu": cpu_identity(),
            "threads": args.threads,
            "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
            "note": "shared machine: other processes used the same cores (±30%)",
        },
        "command": "python bench/decoder_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dtypes": {t.name: str(t.decoder.dtype).removeprefix("torch.") for t in trees},
        "frames_per_stream": args.frames,
        "rounds": args.rounds,
        "trees": trees_arg,
        "results": {name: {c: summary(xs) for c, xs in per.items()} for name, per in runs.items()},
        f"audio_vs_{trees[0].name}": {
            t.name: {
                "max_abs_diff": float((audio[t.name] - ref).abs().max()),
                # the measure of tests/unit/decoder/test_precision.py
                "relative_l2": float((audio[t.name] - ref).norm() / ref.norm()),
            }
            for t in trees[1:]
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
