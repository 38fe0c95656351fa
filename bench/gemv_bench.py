"""GB/s of weights read by each CPU linear kernel at a few row counts, on the talker's shapes.

One decode step at one row is a chain of GEMVs bound by reading the weights; this measures, for
each candidate kernel of :mod:`tts_common.kernels.candidates`, the weight bytes it reads per
second at 1 (and more) rows over layers of the talker's release shapes, with enough distinct
weights that none stays in a cache (as in a step), next to the machine's read bandwidth (a sum
over a buffer far larger than the caches).

    python bench/gemv_bench.py --rows 1,8 --mib 192
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decoder_bench import best_time
from talker_bench import read_bandwidth_gbs

from tts_common.cpu_info import cpu_identity
from tts_common.kernels.candidates import CANDIDATES, make_candidate

SHAPES = ((1024, 3072), (3072, 1024), (1024, 2048), (2048, 1024), (1024, 1024))
"""(in, out) of the talker's layers at the released 0.6B dimensions."""


def _run_all(layers: list, x: torch.Tensor) -> None:
    for layer in layers:
        layer(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--mib", type=int, default=192, help="float32 MiB of distinct weights per shape")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--json")
    opts = ap.parse_args()
    rows = [int(r) for r in opts.rows.split(",")]
    out: dict = {"cpu_model": cpu_identity(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    out["read_gbs"] = round(read_bandwidth_gbs(), 1)
    print(json.dumps(out), flush=True)
    results = []
    with torch.inference_mode():
        for fan_in, fan_out in SHAPES:
            count = max(2, opts.mib * 2**20 // (4 * fan_in * fan_out))
            dense = [torch.nn.Linear(fan_in, fan_out, bias=False) for _ in range(count)]
            for name in opts.candidates.split(","):
                layers = [make_candidate(name, d) for d in dense]
                if layers[0] is None:
                    continue
                nbytes = sum(layer.weight_bytes() for layer in layers)
                for r in rows:
                    x = torch.randn(r, fan_in, dtype=layers[0].input_dtype)
                    # best_time's warm-up call: the kernels' lazy build, the weights' page faults
                    best = best_time(lambda layers=layers, x=x: _run_all(layers, x), opts.repeat)
                    row = {
                        "shape": f"{fan_in}->{fan_out}",
                        "kernel": name,
                        "rows": r,
                        "gbs": round(nbytes / best / 1e9, 1),
                        "us_per_layer": round(1e6 * best / count, 1),
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
                del layers
    out["results"] = results
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
