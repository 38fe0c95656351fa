"""deploy/OPERATIONS.md stays true to the code it describes.

* the metrics table lists exactly the metrics of ``tts_common.metrics``;
* the sizing figures (KV bytes per position and per slot, weight sizes, the slots-per-GPU table)
  are recomputed from the released dimensions (``tts_common.release_dims``) and the model modules
  built on the meta device;
* every ``QWEN3TTS_*`` variable the guide mentions is read by some process, the entrypoint or the
  compose files (a misspelt variable in a runbook is silently ignored in production);
* the ports / health-service table matches the generated protobuf service names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.compose import process_flags
from tts_common import metrics
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.names import service_name

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
OPS = (DEPLOY / "OPERATIONS.md").read_text(encoding="utf-8")

MiB = 1024 * 1024
GiB = 1024 * MiB
GPUS_MIB = {"H100 80 GB": 81559, "L4 24 GB": 23034, "A10 24 GB": 23028}
"""Memory the driver reports for each GPU (nvidia-smi), MiB."""
HEADROOM = 0.10
RUNTIME_PER_PROCESS = 2 * GiB
CO_LOCATED = 3 * GiB
"""Decoder and speaker processes sharing the GPU (weights + runtime)."""


def _numbers(text: str) -> list[int]:
    return [int(n.replace(" ", "")) for n in re.findall(r"\d[\d ]*\d|\d", text)]


# ---------------------------------------------------------------------------------------------
# Metrics


def test_metrics_table_matches_the_code() -> None:
    documented = set(re.findall(r"`(qwen3tts_[a-z_]+)(?:\{[^}]*\})?`", OPS))
    # PromQL in the alert section uses the histogram series names.
    documented = {re.sub(r"_(bucket|sum|count)$", "", name) for name in documented}
    assert set(metrics.METRIC_NAMES) <= documented, f"undocumented: {set(metrics.METRIC_NAMES) - documented}"
    assert documented <= set(metrics.METRIC_NAMES), f"not metrics: {documented - set(metrics.METRIC_NAMES)}"


# ---------------------------------------------------------------------------------------------
# Sizing


def _kv_bytes_per_position(size: str, bytes_per_value: int) -> int:
    from tts_common.release_dims import talker_config_dict

    cfg = talker_config_dict(size, "custom_voice")
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * bytes_per_value


def _talker_parameters(size: str) -> int:
    torch = pytest.importorskip("torch")
    from talker_service.model.talker import Talker
    from tts_common.release_dims import release_model_config

    with torch.device("meta"):
        talker = Talker(release_model_config(size, "custom_voice").talker)
    return sum(p.numel() for p in talker.parameters())


def test_kv_cache_figures() -> None:
    for size in ("0b6", "1b7"):  # identical for both sizes
        assert _kv_bytes_per_position(size, 2) == 114_688
        assert _kv_bytes_per_position(size, 4) == 229_376
    assert "114 688 B" in OPS and "229 376 B" in OPS
    assert 224 * MiB == 114_688 * 2048
    assert "224 MiB per slot at `max_seq_len` 2048 in bf16" in OPS


def test_weight_sizes() -> None:
    torch = pytest.importorskip("torch")
    from decoder_service.model.decoder import CodecDecoder
    from tts_common.config import SpeechTokenizerConfig
    from tts_common.release_dims import speech_tokenizer_config_dict

    assert f"{_talker_parameters('0b6') * 2 / 1e9:.1f} GB (0.6B)" in OPS
    assert f"{_talker_parameters('1b7') * 2 / 1e9:.1f} GB (1.7B)" in OPS
    config = SpeechTokenizerConfig.from_dict(speech_tokenizer_config_dict())
    with torch.device("meta"):
        decoder = CodecDecoder(config.decoder)
    values = sum(t.numel() for t in decoder.state_dict().values())
    assert f"decoder {values * 4 / 1e9:.2f} GB ({round(values / 1e6)} M parameters, fp32" in OPS


def _table_row(label: str) -> list[list[int]]:
    """The numbers of each column after the label ("0.6B"-style size names dropped)."""
    (row,) = [line for line in OPS.splitlines() if line.startswith(f"| {label} |")]
    columns = row.strip().strip("|").split("|")[1:]
    return [_numbers(re.sub(r"\d\.\dB", "", column)) for column in columns]


def test_slots_per_gpu_table() -> None:
    slot = _kv_bytes_per_position("0b6", 2) * 2048
    weights = {"0b6": _talker_parameters("0b6") * 2, "1b7": _talker_parameters("1b7") * 2}
    for gpu, mib in GPUS_MIB.items():
        usable = mib * MiB * (1 - HEADROOM) - RUNTIME_PER_PROCESS
        alone, shared, suggested = _table_row(gpu)
        for column, extra in ((alone, 0), (shared, CO_LOCATED)):
            computed = [int((usable - weights[size] - extra) // slot) for size in ("0b6", "1b7")]
            assert column == computed, f"{gpu}: table {column}, computed {computed}"
        # A suggestion (one for both sizes, or 0.6B / 1.7B) leaves >= 15% below the ceiling with
        # all stages on the GPU.
        per_size = suggested * 2 if len(suggested) == 1 else suggested
        assert len(per_size) == 2, gpu
        for value, ceiling in zip(per_size, shared, strict=True):
            assert 0 < value <= 0.85 * ceiling, f"{gpu}: suggested {value}, ceiling {ceiling}"


BANDWIDTH_TBS = {
    "H200": 4.80,
    "H100 SXM": 3.35,
    "A100": 2.04,
    "A10G / A10": 0.60,
    "L4": 0.30,
}
"""Peak memory bandwidth of each GPU (vendor data sheets), TB/s."""
ACHIEVED, STEP_TARGET_S, LIVE_CONTEXT = 0.6, 0.040, 512


def _values_read_per_step(size: str) -> int:
    """Weights a decode step reads: talker layers + codec head once, the code predictor's layers
    (and input projection) 15 times and one of its heads per forward."""
    torch = pytest.importorskip("torch")
    from talker_service.model.talker import Talker
    from tts_common.release_dims import release_model_config

    with torch.device("meta"):
        talker = Talker(release_model_config(size, "custom_voice").talker)
    cp = talker.code_predictor
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731 - local shorthand
    forwards = len(cp.lm_head)
    per_forward = count(cp.model.layers) + count(cp.small_to_mtp_projection) + cp.lm_head[0].weight.numel()
    return count(talker.model.layers) + talker.codec_head.weight.numel() + forwards * per_forward


def test_roofline_table() -> None:
    kv = LIVE_CONTEXT * _kv_bytes_per_position("0b6", 2)
    weights = {size: 2 * _values_read_per_step(size) for size in ("0b6", "1b7")}
    assert (
        f"W = {weights['0b6'] / 1e9:.2f} GB (0.6B" in OPS and f"= {weights['1b7'] / 1e9:.2f} GB (1.7B" in OPS
    )
    assert f"{kv / 1e6:.1f} MB of KV per stream" in OPS
    for gpu, tbs in BANDWIDTH_TBS.items():
        bandwidth = ACHIEVED * tbs * 1e12
        peak, _, _, streams = _table_row(gpu)
        expected_floor = {
            size: [round((weights[size] + b * kv) / bandwidth * 1e3, 1) for b in (1, 64)] for size in weights
        }
        assert peak == _numbers(f"{tbs:.2f}")
        for column, size in ((2, "0b6"), (3, "1b7")):
            got = [float(x) for x in re.findall(r"\d+\.\d", _row_text(gpu, column))]
            assert got == expected_floor[size], f"{gpu} {size}: {got} != {expected_floor[size]}"
        assert streams == [int((bandwidth * STEP_TARGET_S - weights[size]) // kv) for size in ("0b6", "1b7")]


def _row_text(label: str, column: int) -> str:
    (row,) = [line for line in OPS.splitlines() if line.startswith(f"| {label} |")]
    return row.strip().strip("|").split("|")[column]


def test_suggested_slots_respect_the_roofline() -> None:
    kv = LIVE_CONTEXT * _kv_bytes_per_position("0b6", 2)
    for gpu, roofline_gpu in (
        ("H100 80 GB", "H100 SXM"),
        ("L4 24 GB", "L4"),
        ("A10 24 GB", "A10G / A10"),
    ):
        suggested = _table_row(gpu)[2]
        per_size = suggested * 2 if len(suggested) == 1 else suggested
        bandwidth = ACHIEVED * BANDWIDTH_TBS[roofline_gpu] * 1e12
        for value, size in zip(per_size, ("0b6", "1b7")):
            assert value <= (bandwidth * STEP_TARGET_S - 2 * _values_read_per_step(size)) // kv, (gpu, size)


# ---------------------------------------------------------------------------------------------
# Variables and names


def _process_variables() -> set[str]:
    """Every QWEN3TTS_* variable some process reads (its own flags and the server flags)."""
    return {
        name
        for stage in ("gateway", "talker", "decoder", "speaker")
        for name in process_flags(stage).env_names()
    }


def test_documented_variables_exist() -> None:
    known = _process_variables()
    entrypoint = (DEPLOY / "docker-entrypoint.sh").read_text(encoding="utf-8")
    known.update(re.findall(r"\b(QWEN3TTS_[A-Z0-9_]+)", entrypoint))
    for compose_file in DEPLOY.glob("docker-compose*.yml"):
        known.update(re.findall(r"\$\{(QWEN3TTS_[A-Z0-9_]+)", compose_file.read_text()))
    documented = set(re.findall(r"\b(QWEN3TTS_[A-Z0-9_]+)\b(?!\*)", OPS))
    documented = {d for d in documented if not d.endswith("_")}  # QWEN3TTS_*_DEVICE patterns
    unknown = sorted(documented - known)
    assert not unknown, f"OPERATIONS.md mentions variables nothing reads: {unknown}"


def test_port_table() -> None:
    expected = {
        "gateway": (50051, 9091, service_name(tts_pb2, "TextToSpeech")),
        "talker": (50052, 9092, service_name(stages_pb2, "Talker")),
        "decoder": (50053, 9093, service_name(stages_pb2, "Decoder")),
        "speaker": (50054, 9094, service_name(stages_pb2, "Speaker")),
    }
    for stage, (port, metrics_port, health) in expected.items():
        (row,) = [line for line in OPS.splitlines() if line.startswith(f"| {stage} | {port}")]
        assert f"| {metrics_port} |" in row and f"`{health}`" in row, row
