"""The offline command reproduces every fixture request of every checkpoint (issue: model core).

Runs the command's ``main`` (``qwen3-tts synthesize --requests ...``) on each fixture set and
compares with the official implementation's outputs: codes identical, waveforms within 1e-4. The
command runs in this process (a subprocess per call cost ~5 s of imports each); one test runs the
real console entry point in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from qwen3_tts.cli import main
from tests.helpers.fixtures import CHECKPOINT_NAMES, CKPT_DIR, REFERENCE_DIR


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``qwen3-tts ARGV`` in this process; return its exit code and standard error."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    code = exit_info.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_offline_cli_matches_reference(tmp_path, capsys, name):
    requests = REFERENCE_DIR / name / "requests.jsonl"
    code, stderr = run_cli(
        [
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
        capsys,
    )
    assert code == 0, stderr
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
def test_offline_cli_rejects_invalid_requests(tmp_path, capsys, extra, message):
    code, stderr = run_cli(
        [
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
        capsys,
    )
    assert code == 2
    assert message in stderr, stderr


def test_offline_cli_rejects_unreadable_reference_audio(tmp_path, capsys):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    code, stderr = run_cli(
        [
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
        capsys,
    )
    assert code == 2
    assert "could not decode audio" in stderr, stderr


def test_make_dev_model_loads_back_and_synthesizes(tmp_path, capsys):
    for kind, extra in [
        ("custom_voice", ["--speaker", "ryan"]),
        ("base", None),
        ("voice_design", ["--instruct", "Calm."]),
    ]:
        ckpt = tmp_path / kind
        code, stderr = run_cli(["make-dev-model", str(ckpt), "--type", kind], capsys)
        assert code == 0, stderr
        if extra is None:
            ref = tmp_path / "ref.wav"
            t = np.arange(24000) / 24000
            sf.write(ref, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
            extra = ["--ref-audio", str(ref), "--ref-text", "A reference sentence."]
        out = tmp_path / f"{kind}.wav"
        code, stderr = run_cli(
            [
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
            capsys,
        )
        assert code == 0, stderr
        wav, sr = sf.read(out, dtype="float32")
        codes = np.load(tmp_path / f"{kind}.npy")
        assert sr == 24000 and len(wav) == codes.shape[0] * 1920 and np.isfinite(wav).all()
    # --if-missing keeps an existing checkpoint; this call goes through the real console entry
    # point (``python -m qwen3_tts.cli``) in a subprocess.
    stamp = (tmp_path / "base" / "model.safetensors").stat().st_mtime_ns
    subprocess.run(
        [sys.executable, "-m", "qwen3_tts.cli", "make-dev-model", str(tmp_path / "base"), "--if-missing"],
        check=True,
        timeout=60,
    )
    assert (tmp_path / "base" / "model.safetensors").stat().st_mtime_ns == stamp
