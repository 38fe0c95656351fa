"""Forced-aligner cost: milliseconds of compute per second of aligned audio, batch 1 vs batch 8.

Builds the aligner with random weights, either the dev checkpoint (``--size dev``: tiny widths,
through ``load_aligner``) or at the RELEASED dimensions of Qwen3-ForcedAligner-0.6B
(``--size release``, ARCHITECTURE.md §12: audio tower 24 layers x 1024, text model 28 layers x
1024, 5000 classes; built in memory, the dev vocabulary's tokenizer), and measures in one run:

* ``prepare``: the CPU front end per utterance (resampling 24 kHz -> 16 kHz, log-mel, token ids);
* ``model``: the forward pass over prepared prompts, the utterances one by one (batch 1) and as
  one left-padded batch (batch 8), as ms per second of audio (best of ``--repeat``);
* the weights' size and, on CUDA, the peak memory allocated.

    python bench/aligner_bench.py --size release --dtype float32 --seconds 4 --json out.json
    python bench/aligner_bench.py --size release --device cuda --dtype bfloat16

The report starts with the CPU model (numbers from a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aligner_service.model import AlignInput, ForcedAligner, load_aligner
from aligner_service.model.config import ForcedAlignerConfig
from aligner_service.model.frontend import AlignerFrontend
from aligner_service.model.text_model import AlignerThinker
from qwen3_tts.dev_aligner import make_dev_aligner, tiny_aligner_config
from tts_common.cpu_info import cpu_identity

RELEASE_AUDIO = {
    "d_model": 1024,
    "encoder_layers": 24,
    "encoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "downsample_hidden_size": 480,
    "output_dim": 1024,
}
RELEASE_TEXT = {
    "vocab_size": 152064,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
}


def release_config() -> dict[str, Any]:
    """The released dimensions (§12) with the dev vocabulary's token ids (all below 152 064)."""
    config = tiny_aligner_config(classify_num=5000)
    thinker = config["thinker_config"]
    thinker["audio_config"] = thinker["audio_config"] | RELEASE_AUDIO
    thinker["text_config"] = thinker["text_config"] | RELEASE_TEXT
    return config


def build(size: str, device: str, dtype: torch.dtype, folder: Path) -> ForcedAligner:
    dev = make_dev_aligner(folder / "dev-aligner")
    if size == "dev":
        return load_aligner(dev, device=device, dtype=dtype)
    config = ForcedAlignerConfig.from_dict(release_config())
    with torch.device(device):
        thinker = AlignerThinker(config).to(dtype)
    with torch.no_grad():
        for name, p in thinker.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if "norm" in name else p.zero_()
            else:
                p.normal_(std=0.02)
    return ForcedAligner(
        thinker, AlignerFrontend.from_checkpoint(dev, config), model_name="release-dims-random"
    )


def utterances(count: int, seconds: float, rate: int = 24000) -> list[AlignInput]:
    rng = np.random.default_rng(0)
    words = max(1, round(2.5 * seconds))  # about 2.5 words per second of speech
    return [
        AlignInput(
            (rng.standard_normal(int(seconds * rate)) * 0.2).astype(np.float32), rate, ["word"] * words
        )
        for _ in range(count)
    ]


def best(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["dev", "release"], default="release")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--seconds", type=float, default=4.0, help="audio seconds per utterance")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        aligner = build(args.size, args.device, dtype, Path(tmp))
    weights = sum(p.numel() * p.element_size() for p in aligner.thinker.parameters())
    items = utterances(args.batch, args.seconds)
    t0 = time.perf_counter()
    prompts = [aligner.prepare(item) for item in items]
    prepare_ms = (time.perf_counter() - t0) * 1000 / len(items)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    audio_s = args.seconds * len(items)
    one_by_one = best(lambda: [aligner.logits_for_prompts([p]) for p in prompts], args.repeat, sync)
    batched = best(lambda: aligner.logits_for_prompts(prompts), args.repeat, sync)
    report = {
        "cpu": cpu_identity(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "size": args.size,
        "dtype": args.dtype,
        "seconds_per_utterance": args.seconds,
        "words_per_utterance": len(items[0].words),
        "weights_mb": round(weights / 1e6, 1),
        "prepare_ms_per_utterance": round(prepare_ms, 2),
        "model_ms_per_audio_second_batch1": round(one_by_one * 1000 / audio_s, 3),
        f"model_ms_per_audio_second_batch{len(items)}": round(batched * 1000 / audio_s, 3),
    }
    if cuda:
        report["cuda_peak_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
