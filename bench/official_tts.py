"""The official implementation (``qwen_tts``), timed: one request and a batch, float32 on CPU.

Standalone (it imports only torch and qwen_tts), so ``bench/cpu_serving.py`` can run it with the
interpreter of an environment where the official package is installed (a venv with CPU
``torch==2.13.0`` and ``qwen-tts==0.1.1``):

    VENV/bin/python bench/official_tts.py MODEL float32 ryan 41 "Some text." 8

prints one JSON line: per batch size the seconds, audio seconds, audio seconds per second and
milliseconds per frame including the decode.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

FRAME_RATE = 12.5


def bench(
    model: Path, dtype: str, speaker: str, max_new_tokens: int, text: str, batch: int
) -> dict[str, Any]:
    """``Qwen3TTSModel.from_pretrained`` + ``generate_custom_voice`` at batch 1 and ``batch``;
    any failure is reported, not raised (a third-party API)."""
    try:
        import torch
        from qwen_tts import Qwen3TTSModel  # type: ignore[import-not-found]
    except ImportError as exc:
        return {"skipped": f"qwen_tts not importable: {exc}"}
    try:
        tts = Qwen3TTSModel.from_pretrained(str(model), device_map="cpu", dtype=getattr(torch, dtype))
        kwargs = {"language": "English", "speaker": speaker, "max_new_tokens": max_new_tokens}
        out: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
        for size in (1, batch):
            texts = [text] * size
            t0 = time.perf_counter()
            wavs, sr = tts.generate_custom_voice(text=texts if size > 1 else text, **kwargs)
            seconds = time.perf_counter() - t0
            audio_s = sum(len(w) for w in wavs) / sr
            out[f"batch_{size}"] = {
                "seconds": round(seconds, 3),
                "audio_seconds": round(audio_s, 3),
                "audio_seconds_per_second": round(audio_s / seconds, 3),
                "ms_per_frame_incl_decode": round(1000 * seconds / max(audio_s / size * FRAME_RATE, 1e-9), 1),
            }
        return out
    except Exception as exc:  # noqa: BLE001 - a third-party API: report whatever it raises
        return {"failed": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    model_dir, dtype_name, speaker_name, frames, text_arg, batch_arg = sys.argv[1:7]
    print(json.dumps(bench(Path(model_dir), dtype_name, speaker_name, int(frames), text_arg, int(batch_arg))))
