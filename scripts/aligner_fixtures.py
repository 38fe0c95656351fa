"""Build tests/fixtures/aligner/: a tiny Qwen3-ForcedAligner checkpoint and the official outputs.

Run in the OFFICIAL package's environment (``ORACLE_VENV``: a virtual environment with
``pip install torch==2.13.0 qwen-asr==0.0.6``):

    $ORACLE_VENV/bin/python scripts/aligner_fixtures.py

Writes
* ``ckpt/``: the released layout (§12) at tiny widths: ``config.json`` (``thinker_config.model_type``
  ``qwen3_forced_aligner``, 256 timestamp classes), bf16 ``model.safetensors`` (``thinker.*``),
  the compact vocabulary's ``vocab.json`` / ``merges.txt`` / ``tokenizer_config.json`` and the
  Whisper ``preprocessor_config.json``, all from :mod:`qwen3_tts.dev_aligner`. The weights are
  seeded random tensors with the deliberate timestamp structure documented there
  (``structure_timestamp_weights``: the class at a ``<timestamp>`` is about
  ``round(K * n_timestamps / n_audio_tokens)`` plus the random rest of the network, so classes
  vary across words); the official model loads them with ``Qwen3ForcedAligner.from_pretrained``.
* ``cases.json``: per case its language, text, input rate, the official word list and aligned
  items (seconds), the official argmax classes at the ``<timestamp>`` positions (float32, alone;
  the same in one official batch of all cases; bfloat16 alone) and their top-1/top-2 margins.
* ``CASE.npz``: ``audio`` (the input samples as int16 PCM: the official ran on ``audio / 32768``
  at the case's rate, mono or [n, 2]), ``input_ids``, ``features`` (the official log-mel input
  [128, frames]; left out for the long case), ``logits`` (float32 [2 * words, 256] at the
  timestamp positions; ``logits_bf16`` the same from the bf16 model), ``classes``.

The official outputs come from the official objects: ``Qwen3ForcedAligner.align`` for the items,
and its ``processor`` + ``model.thinker`` for the logits (what ``align`` computes before its argmax).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "aligner"
SEED = 20260127
K = 40.0
CLASSIFY_NUM = 256


def _dev_aligner():
    """qwen3_tts/dev_aligner.py, imported by path (the project is not installed in this venv)."""
    spec = importlib.util.spec_from_file_location("dev_aligner", REPO / "qwen3_tts" / "dev_aligner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def speechlike(seconds: float, rate: int, seed: int, peak: float = 0.6, channels: int = 1) -> np.ndarray:
    """Deterministic syllable-like audio: voiced harmonics with a gliding pitch under a
    syllable envelope, with pauses and a little noise; int16 PCM."""
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    t = np.arange(n) / rate
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(2.5, 4.0) * t) + rng.uniform(-0.3, 0.3), 0, None)
    x = voice * syllables + 0.05 * rng.standard_normal(n)
    x = peak * x / np.max(np.abs(x))
    if channels > 1:
        x = np.stack([x, np.roll(x, 37) * 0.8][:channels], axis=1)
    return np.round(np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


CASES = [
    # name, language, text, seconds, rate, peak, channels
    (
        "english",
        "English",
        "Hello world, this isn't a test of 3.5-hour iPhone alignment!",
        2.0,
        16000,
        0.6,
        1,
    ),
    ("chinese", "Chinese", "今天天气很好，我们去公园散步吧", 1.5, 24000, 0.5, 1),
    ("japanese", "Japanese", "東京タワーに行きました。", 1.0, 44100, 0.7, 1),
    # 24 059 samples: not a multiple of the 160-sample hop, so the official batch (features of the
    # zero-padded waveform) gives it one frame more than it has alone
    ("korean", "Korean", "안녕하세요 저는 학생입니다", 24059 / 16000, 16000, 0.6, 1),
    # int16 / 32768 * 2.5 peaks above 1: the official divides by the peak (and averages 2 channels)
    ("german", "German", "Grüße aus München: Straße Nr. 7!", 1.0, 22050, 2.5, 2),
    (
        "long",
        "English",
        " ".join(["one two three four five six seven eight nine ten"] * 3),
        8.5,
        16000,
        0.6,
        1,
    ),
]


def main() -> None:
    dev = _dev_aligner()
    from qwen_asr import Qwen3ForcedAligner
    from qwen_asr.core.transformers_backend import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration
    from qwen_asr.inference.utils import normalize_audios

    # Only this script's outputs are replaced: the folder also holds the text processor's
    # fixtures (scripts/aligner_text_fixtures.py).
    ckpt = OUT / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    config = dev.tiny_aligner_config(classify_num=CLASSIFY_NUM)
    official = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(**config))
    shapes = {k: tuple(v.shape) for k, v in official.state_dict().items()}
    state = dev.random_aligner_state(shapes, SEED)
    dev.structure_timestamp_weights(state, config, K)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(ckpt / "model.safetensors")
    )
    dev.write_tokenizer_files(ckpt)
    (ckpt / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}, indent=2))

    aligner = Qwen3ForcedAligner.from_pretrained(str(ckpt))
    assert tuple(aligner.model.thinker.lm_head.weight.shape) == (CLASSIFY_NUM, 64)
    aligner_bf16 = Qwen3ForcedAligner.from_pretrained(str(ckpt), dtype=torch.bfloat16)
    ts_id = config["timestamp_token_id"]

    def run(model, prompts, audios):
        inputs = aligner.processor(text=prompts, audio=audios, return_tensors="pt", padding=True)
        inputs = inputs.to(model.model.dtype)
        with torch.inference_mode():
            logits = model.model.thinker(**inputs).logits.float()
        rows = [logits[i][inputs["input_ids"][i] == ts_id] for i in range(len(prompts))]
        return inputs, rows

    meta = {"seed": SEED, "k": K, "classify_num": CLASSIFY_NUM, "cases": {}}
    prompts, audios16 = [], []
    for name, language, text, seconds, rate, peak, channels in CASES:
        pcm = speechlike(seconds, rate, seed=len(prompts) + 1, peak=min(peak, 1.0), channels=channels)
        audio = pcm.astype(np.float32) / 32768.0 * (peak if peak > 1 else 1.0)
        words, prompt = aligner.aligner_processor.encode_timestamp(text, language)
        audio16 = normalize_audios([(audio, rate)])[0]
        inputs, (logits,) = run(aligner, [prompt], [audio16])
        _, (logits_bf16,) = run(aligner_bf16, [prompt], [audio16])
        classes = logits.argmax(-1)
        top2 = logits.topk(2, dim=-1).values
        items = aligner.align(audio=(audio, rate), text=text, language=language)[0]
        fixed = aligner.aligner_processor.fix_timestamp((classes * 80.0).numpy())
        assert [round(v / 1000.0, 3) for v in fixed] == [
            x for it in items for x in (it.start_time, it.end_time)
        ], name
        arrays = {
            "audio": pcm,
            "input_ids": inputs["input_ids"][0].numpy(),
            "logits": logits.numpy(),
            "logits_bf16": logits_bf16.numpy(),
            "classes": classes.numpy(),
        }
        if name != "long":
            arrays["features"] = inputs["input_features"][0].float().numpy()
        np.savez_compressed(OUT / f"{name}.npz", **arrays)
        meta["cases"][name] = {
            "language": language,
            "text": text,
            "sample_rate": rate,
            "scale": peak if peak > 1 else 1.0,
            "words": words,
            "items": [[it.text, it.start_time, it.end_time] for it in items],
            "classes": classes.tolist(),
            "classes_bf16": logits_bf16.argmax(-1).tolist(),
            "margins": (top2[:, 0] - top2[:, 1]).tolist(),
            "margins_bf16": (lambda t: (t[:, 0] - t[:, 1]).tolist())(logits_bf16.topk(2, dim=-1).values),
            "mel_frames": int(inputs["feature_attention_mask"].sum()),
        }
        prompts.append(prompt)
        audios16.append(audio16)
        print(
            name,
            "words",
            len(words),
            "classes",
            classes.tolist(),
            "min margin",
            float((top2[:, 0] - top2[:, 1]).min()),
        )
    _, batch_rows = run(aligner, prompts, audios16)
    for (name, *_), row in zip(CASES, batch_rows):
        single = torch.from_numpy(np.load(OUT / f"{name}.npz")["logits"])
        meta["cases"][name]["classes_official_batch"] = row.argmax(-1).tolist()
        meta["cases"][name]["official_batch_max_logit_diff"] = float((row - single).abs().max())
    (OUT / "cases.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
    readme = "# Aligner model fixture (generated by scripts/aligner_fixtures.py)\n\n" + (__doc__ or "")
    readme += (
        "\n``text_cases.json`` and ``repair_cases.json`` (word splitting and timestamp repair) come"
        " from ``scripts/aligner_text_fixtures.py``.\n"
    )
    (OUT / "README.md").write_text(readme, encoding="utf-8")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file() and "_cases" not in p.name)
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    sys.exit(main())
