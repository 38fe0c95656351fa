"""``qwen3-tts doctor --device cpu`` (the emulated graph path, CI-sized): every check passes and
the JSON report holds every check, time and memory figure; an injected wrong block list or a
failed capture makes it fail, naming the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from decoder_service.config import DEFAULT_GRAPH_MEMORY
from qwen3_tts.cli import main
from tests.helpers.talker import wrong_partial_index
from tts_common.cuda_graphs import StepCapture

CKPT = Path(__file__).resolve().parents[2] / "fixtures" / "ckpt" / "tiny_custom_voice_1b7"
SMALL = [
    "--max-slots", "2", "--max-seq-len", "140", "--timed-steps", "1",
    "--decoder-batch-buckets", "1,2", "--decoder-frame-buckets", "1,3",
]  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _doctor(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--device", "cpu", "--model", str(CKPT), *SMALL, "--json", str(out), *extra])
    return int(exit_info.value.code or 0), json.loads(out.read_text())


def test_doctor_passes_on_cpu_and_reports_everything(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, report = _doctor(tmp_path)
    failed = [c for c in report["checks"] if not c["passed"]]
    assert code == 0 and report["passed"], failed
    names = [c["name"] for c in report["checks"]]
    for name in (
        "environment.c_compiler",
        "talker.capture",
        "talker.block_lists",
        "talker.attention",
        "talker.graph_vs_eager",
        "talker.step_time",
        "decoder.capture",
        "decoder.graph_vs_eager",
        "decoder.chunk_time",
    ):
        assert name in names
    assert report["environment"]["torch"] == torch.__version__
    assert set(report["talker"]["step_seconds"]) == {"1", "2"}
    assert all(s > 0 for s in report["talker"]["step_seconds"].values())
    assert set(report["decoder"]["chunk_seconds"]) == {"1x1", "1x3", "2x1", "2x3"}
    assert report["talker"]["step_path"] == report["decoder"]["step_path"] == "emulated-graphs"
    memory = report["memory"]
    assert memory["talker_weights_bytes"] > 0 and memory["talker_kv_bytes"] > 0 and memory["peak_bytes"] > 0
    plan = report["plan"]
    assert (
        plan["kv_budget_bytes"] + plan["reserve_bytes"] + sum(s["bytes"] for s in plan["shares"])
        == plan["total_bytes"]
    )
    assert plan["slots"] == plan["kv_budget_bytes"] // plan["kv_bytes_per_slot"] > 0
    graph_memory = report["decoder"]["graph_memory"]
    assert graph_memory["bound_bytes"] == DEFAULT_GRAPH_MEMORY  # the decoder server's default
    assert graph_memory["captured_batch_buckets"] == [1, 2] and graph_memory["left_out_batch_buckets"] == []
    assert 0 < graph_memory["held_bytes"] <= DEFAULT_GRAPH_MEMORY
    out = capsys.readouterr().out
    assert "doctor: all checks passed" in out and "memory plan of cpu" in out
    assert f"graphs: {graph_memory['summary']}" in out and "bound 4.00 GiB" in out


def test_doctor_reports_what_fits_a_decoder_graph_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The fixture's decoder graphs hold ~0.15 MiB per batch-1 row of buckets (emulated count):
    300 KiB fits batch size 1 only, 1 KiB nothing (a failed capture, named)."""
    code, report = _doctor(tmp_path, "--decoder-graph-memory", "300KiB")
    graph_memory = report["decoder"]["graph_memory"]
    assert code == 0 and report["passed"], [c for c in report["checks"] if not c["passed"]]
    assert graph_memory["bound_bytes"] == 300 * 2**10 and 0 < graph_memory["held_bytes"] <= 300 * 2**10
    assert graph_memory["captured_batch_buckets"] == [1] and graph_memory["left_out_batch_buckets"] == [2]
    assert set(report["decoder"]["chunk_seconds"]) == {"1x1", "1x3"}
    assert "batch sizes 2 left out (run as groups of 1)" in capsys.readouterr().out

    code, report = _doctor(tmp_path, "--decoder-graph-memory", "1KiB")
    failed = {c["name"]: c["reason"] for c in report["checks"] if not c["passed"]}
    assert code == 1 and list(failed) == ["decoder.capture"]
    assert "no batch size fits --graph-memory" in failed["decoder.capture"]
    assert report["decoder"]["step_path"] == "eager"


def test_doctor_fails_naming_a_wrong_block_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong_partial_index(monkeypatch)
    code, report = _doctor(tmp_path)
    failed = {c["name"]: c["reason"] for c in report["checks"] if not c["passed"]}
    assert code == 1 and list(failed) == ["talker.block_lists"]
    assert "partial-block list" in failed["talker.block_lists"]


def test_doctor_fails_naming_a_compile_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(self: StepCapture, name: str, step: object) -> None:
        raise RuntimeError("InductorError: CalledProcessError: cc not found")

    monkeypatch.setattr(StepCapture, "capture", fail)
    code, report = _doctor(tmp_path)
    failed = {c["name"]: c["reason"] for c in report["checks"] if not c["passed"]}
    assert code == 1 and set(failed) == {"talker.capture", "decoder.capture"}
    assert "cc not found" in failed["talker.capture"]


def test_doctor_takes_dtype_auto_and_resolves_it_per_stage_as_the_stages_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tts_common import auto_dtype

    measured: list[str] = []

    def measured_cpu_dtype(probe: auto_dtype.StepProbe) -> str:  # stood in for: it takes seconds
        measured.append(probe.stage)
        if probe.stage == "talker":  # timed in the engine the doctor checks: its 2 slots (SMALL)
            assert probe.buckets == (1, 2) and "for rows (1, 2)" in probe.what
        return {"talker": "bfloat16", "decoder": "float32"}[probe.stage]

    monkeypatch.setattr(auto_dtype, "measured_cpu_dtype", measured_cpu_dtype)
    code, report = _doctor(tmp_path, "--dtype", "auto")
    assert code == 0 and report["passed"], [c for c in report["checks"] if not c["passed"]]
    assert sorted(measured) == ["decoder", "talker"]
    assert report["environment"]["talker_dtype"] == "bfloat16"
    assert report["environment"]["decoder_dtype"] == "float32"
