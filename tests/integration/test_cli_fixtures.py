"""The offline command reproduces every fixture request of every checkpoint (issue: model core).

Runs the real console entry point (``python -m qwen3_tts.cli synthesize --requests ...``) in a
subprocess on each fixture set and compares with the official implementation's outputs: codes
identical, waveforms within 1e-4.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.fixtures import CHECKPOINT_NAMES, CKPT_DIR, REFERENCE_DIR


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_offline_cli_matches_reference(tmp_path, name):
    requests = REFERENCE_DIR / name / "requests.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts.cli",
            "synthesize",
            "--model",
            str(CKPT_DIR / name),
            "--requests",
            str(requests),
            "--out-dir",
            str(tmp_path),
            "--greedy",
            "--max-new-tokens",
            "80",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for line in requests.read_text().splitlines():
        req = json.loads(line)
        codes = np.load(tmp_path / f"{req['id']}.codes.npy")
        expected_codes = np.load(REFERENCE_DIR / name / req["expect"]["codes"])
        assert codes.dtype == np.int64 and codes.shape == expected_codes.shape, req["id"]
        np.testing.assert_array_equal(codes, expected_codes, err_msg=req["id"])
        wav, sr = sf.read(tmp_path / f"{req['id']}.wav", dtype="float32")
        expected_wav = np.load(REFERENCE_DIR / name / req["expect"]["wav"])
        assert sr == 24000 and wav.shape == expected_wav.shape, req["id"]
        assert np.abs(wav - expected_wav).max() <= 1e-4, req["id"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speaker", "Nobody"], "unknown speaker"),
        (["--speaker", "Ryan", "--language", "Klingon"], "unknown language"),
        (["--speaker", "Ryan", "--instruct", "Speak softly."], "instruct is not supported"),
        (["--speaker", "Ryan", "--ref-text", "hi"], "--ref-text needs --ref-audio"),
    ],
)
def test_offline_cli_rejects_invalid_requests(tmp_path, extra, message):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts.cli",
            "synthesize",
            "--model",
            str(CKPT_DIR / "tiny_custom_voice"),
            "--text",
            "Hello.",
            "--out",
            str(tmp_path / "o.wav"),
            "--greedy",
            "--max-new-tokens",
            "5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_offline_cli_rejects_unreadable_reference_audio(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts.cli",
            "synthesize",
            "--model",
            str(CKPT_DIR / "tiny_base"),
            "--text",
            "Hello.",
            "--out",
            str(tmp_path / "o.wav"),
            "--ref-audio",
            str(bad),
            "--x-vector-only",
            "--greedy",
            "--max-new-tokens",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "could not decode audio" in proc.stderr, proc.stderr


def test_make_dev_model_loads_back_and_synthesizes(tmp_path):
    for kind, extra in [
        ("custom_voice", ["--speaker", "ryan"]),
        ("base", None),
        ("voice_design", ["--instruct", "Calm."]),
    ]:
        ckpt = tmp_path / kind
        proc = subprocess.run(
            [sys.executable, "-m", "qwen3_tts.cli", "make-dev-model", str(ckpt), "--type", kind],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        if extra is None:
            ref = tmp_path / "ref.wav"
            t = np.arange(24000) / 24000
            sf.write(ref, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
            extra = ["--ref-audio", str(ref), "--ref-text", "A reference sentence."]
        out = tmp_path / f"{kind}.wav"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "qwen3_tts.cli",
                "synthesize",
                "--model",
                str(ckpt),
                "--text",
                "Hello world.",
                "--out",
                str(out),
                "--codes-out",
                str(tmp_path / f"{kind}.npy"),
                "--seed",
                "0",
                "--max-new-tokens",
                "30",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        wav, sr = sf.read(out, dtype="float32")
        codes = np.load(tmp_path / f"{kind}.npy")
        assert sr == 24000 and len(wav) == codes.shape[0] * 1920 and np.isfinite(wav).all()
    # --if-missing keeps an existing checkpoint.
    stamp = (tmp_path / "base" / "model.safetensors").stat().st_mtime_ns
    subprocess.run(
        [sys.executable, "-m", "qwen3_tts.cli", "make-dev-model", str(tmp_path / "base"), "--if-missing"],
        check=True,
        timeout=60,
    )
    assert (tmp_path / "base" / "model.safetensors").stat().st_mtime_ns == stamp
