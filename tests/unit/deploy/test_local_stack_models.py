"""``qwen3-tts up`` with several models (qwen3_tts.local_stack): one talker per model, a speaker
stage per Base model, one decoder pool, and a gateway whose ``--models`` points at them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import FLAGS, ModelRoute, gateway_config_from_args
from qwen3_tts.cli import build_parser
from qwen3_tts.local_stack import (
    ServedModel,
    on_free_ports,
    replica_group,
    served_models,
    stage_commands,
    stage_of,
)
from tests.helpers.compose import flag_value

TYPES = {"design": "voice_design", "base": "base", "custom": "custom_voice"}


def checkpoints(root: Path, types: dict[str, str]) -> list[str]:
    """A ``config.json`` per model (all ``served_models`` reads); the ``--model NAME=DIR`` args."""
    args = []
    for name, model_type in types.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps({"tts_model_type": model_type}))
        args += ["--model", f"{name}={root / name}"]
    return args


def gateway_config(stages: list) -> object:
    return gateway_config_from_args(FLAGS.parser().parse_args(stages[-1].args[3:]))


def test_three_models_one_decoder_pool(tmp_path: Path) -> None:
    models = served_models(build_parser().parse_args(["up", *checkpoints(tmp_path, TYPES)]))
    assert [(m.name, m.clones) for m in models] == [("design", False), ("base", True), ("custom", False)]
    stages = stage_commands(models, "127.0.0.1", 50051, 50052, None, True)
    assert [(s.name, s.port, s.model) for s in stages] == [
        ("talker-design", 50052, "design"),
        ("decoder", 50053, None),
        ("talker-base", 50054, "base"),
        ("speaker-base", 50055, "base"),
        ("talker-custom", 50056, "custom"),
        ("gateway", 50051, None),
    ]
    assert flag_value(stages[1].args, "--model") == str(tmp_path / "design")  # the pool's tokenizer
    assert [flag_value(s.args, "--metrics-port") for s in stages] == [
        "9092",
        "9093",
        "9094",
        "9095",
        "9096",
        "9091",
    ]
    config = gateway_config(stages)
    assert config.models == (  # type: ignore[attr-defined]
        ModelRoute("design", ("127.0.0.1:50052",)),
        ModelRoute("base", ("127.0.0.1:50054",), ("127.0.0.1:50055",)),
        ModelRoute("custom", ("127.0.0.1:50056",)),
    )
    assert config.decoder_targets == ("127.0.0.1:50053",)  # type: ignore[attr-defined]


@settings(max_examples=20, deadline=None)
@given(replicas=st.integers(1, 4), order=st.permutations(list(TYPES)))
def test_replicas_of_several_models_are_all_targets_on_free_ports(replicas: int, order: list[str]) -> None:
    models = [ServedModel(Path(f"/m/{n}"), n, clones=TYPES[n] == "base") for n in order]
    stages = stage_commands(models, "127.0.0.1", 1000, 2000, "cpu", False, replicas)
    ports = [s.port for s in stages[:-1]]
    assert ports == list(range(2000, 2000 + len(ports)))  # consecutive from the base
    assert sum(stage_of(s.name) == "talker" for s in stages) == 3 * replicas
    assert sum(stage_of(s.name) == "decoder" for s in stages) == replicas
    assert [s.name for s in stages if stage_of(s.name) == "speaker"] == ["speaker-base"]
    on_free_ports(stages)
    config = gateway_config(stages)
    routes = {m.name: m for m in config.models}  # type: ignore[attr-defined]
    assert list(routes) == order  # the first is the default
    for name in order:
        talkers = [s.address for s in stages if stage_of(s.name) == "talker" and s.model == name]
        assert routes[name].talker_targets == tuple(talkers) and len(talkers) == replicas
        speakers = [s.address for s in stages if stage_of(s.name) == "speaker" and s.model == name]
        assert routes[name].speaker_targets == tuple(speakers)
    assert config.decoder_targets == tuple(  # type: ignore[attr-defined]
        s.address for s in stages if stage_of(s.name) == "decoder"
    )


def test_one_named_model_keeps_the_classic_processes() -> None:
    stages = stage_commands([ServedModel(Path("/m/x"), "mine")], "127.0.0.1", 50051, 50052, None, False)
    assert [s.name for s in stages] == ["talker", "decoder", "speaker", "gateway"]
    assert gateway_config(stages).models == (  # type: ignore[attr-defined]
        ModelRoute("mine", ("127.0.0.1:50052",), ("127.0.0.1:50054",)),
    )


def test_model_arguments_and_dev_types(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    (tmp_path / "a").mkdir()
    models = served_models(parse(["up", "--model", str(tmp_path / "a")]))
    assert models == [ServedModel((tmp_path / "a").resolve())]  # one unnamed model: the classic stack
    with pytest.raises(ValueError, match="named alike"):
        served_models(parse(["up", "--model", f"x={tmp_path}", "--model", f"x={tmp_path}"]))
    with pytest.raises(ValueError, match="cannot read the checkpoint"):
        served_models(parse(["up", "--model", f"x={tmp_path / 'a'}", "--model", f"y={tmp_path / 'b'}"]))
    with pytest.raises(SystemExit):
        parse(["up", "--dev-model-type", "base,nope"])
    assert parse(["up", "--dev-model-type", " voice_design, base "]).dev_model_type == "voice_design,base"


def test_replicas_are_grouped_per_model_for_supervision(tmp_path: Path) -> None:
    """``up`` stops when every replica of a group is lost: each model's talkers (and a Base
    model's speakers) are a group of their own, the decoder pool one group for all models."""
    models = served_models(build_parser().parse_args(["up", *checkpoints(tmp_path, TYPES)]))
    stages = stage_commands(models, "127.0.0.1", 50051, 50052, None, False, replicas=2)
    groups = {s.name: replica_group(s) for s in stages}
    assert groups["talker-design"] == groups["talker-design-2"] == "talker (model design)"
    assert groups["talker-base"] == "talker (model base)" != groups["talker-custom"]
    assert groups["speaker-base"] == "speaker (model base)"
    assert groups["decoder"] == groups["decoder-2"] == "decoder" and groups["gateway"] == "gateway"
    one = stage_commands(Path("/m"), "127.0.0.1", 50051, 50052, None, False, replicas=2)
    assert {replica_group(s) for s in one} == {"talker", "decoder", "speaker", "gateway"}
