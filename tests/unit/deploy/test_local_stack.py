"""``qwen3-tts up`` command lines (qwen3_tts.local_stack.stage_commands), ``--replicas`` included,
and its refusal to start on ports another process holds."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import FLAGS, gateway_config_from_args
from qwen3_tts.cli import build_parser
from qwen3_tts.local_stack import (
    StageProcess,
    busy_port,
    free_port,
    is_replicated,
    listeners,
    on_free_ports,
    port_taken,
    replica_name,
    stage_commands,
    stage_of,
    start_logged,
)
from tests.helpers.compose import flag_value


def test_one_replica_is_the_classic_four_processes() -> None:
    stages = stage_commands(Path("/m"), "0.0.0.0", 50051, 50052, None, True)
    assert [(s.name, s.port) for s in stages] == [
        ("talker", 50052),
        ("decoder", 50053),
        ("speaker", 50054),
        ("gateway", 50051),
    ]
    assert [flag_value(s.args, "--metrics-port") for s in stages] == ["9092", "9093", "9094", "9091"]
    assert flag_value(stages[-1].args, "--talker-targets") == "127.0.0.1:50052"
    assert "--voices-db" not in stages[-1].args  # the gateway's default: a temporary library


def test_up_keeps_registered_voices_in_a_sqlite_file() -> None:
    """``qwen3-tts up`` (and so ``make up``) gives the gateway a voice library that outlives it."""
    from qwen3_tts.cli import build_parser

    args = build_parser().parse_args(["up"])
    assert args.voices_db == ".qwen3-tts/voices.db"
    stages = stage_commands(Path("/m"), "127.0.0.1", 50051, 50052, None, False, voices_db=args.voices_db)
    config = gateway_config_from_args(FLAGS.parser().parse_args(stages[-1].args[3:]))
    assert config.voices_db == ".qwen3-tts/voices.db"


@given(replicas=st.integers(1, 6), base=st.integers(1024, 60000), metrics=st.booleans())
def test_replicas_get_their_own_ports_and_are_all_gateway_targets(
    replicas: int, base: int, metrics: bool
) -> None:
    stages = stage_commands(Path("/m"), "127.0.0.1", 1000, base, "cpu", metrics, replicas)
    names = [s.name for s in stages]
    assert names[:3] == ["talker", "decoder", "speaker"] and names[-1] == "gateway"
    for kind in ("talker", "decoder"):
        assert [n for n in names if stage_of(n) == kind] == [kind] + [
            f"{kind}-{k}" for k in range(2, replicas + 1)
        ]
    ports = [s.port for s in stages]
    assert len(set(ports)) == len(ports)
    assert sorted(ports[:-1]) == list(range(base, base + 2 * replicas + 1))  # consecutive from base
    for stage in stages[:-1]:
        assert flag_value(stage.args, "--port") == str(stage.port)
        assert stage.args[2] == f"{stage_of(stage.name)}_service"
        assert is_replicated(stage.name) == (stage.name != "speaker")
    if metrics:
        metric_ports = [flag_value(s.args, "--metrics-port") for s in stages]
        assert len(set(metric_ports)) == len(metric_ports)
    on_free_ports(stages)
    config = gateway_config_from_args(FLAGS.parser().parse_args(stages[-1].args[3:]))
    for kind, targets in (("talker", config.talker_targets), ("decoder", config.decoder_targets)):
        assert targets == tuple(s.address for s in stages if stage_of(s.name) == kind)
        assert len(targets) == replicas
    assert config.speaker_targets == (stages[2].address,)


@given(stage=st.sampled_from(["talker", "decoder", "speaker", "gateway"]), index=st.integers(0, 50))
def test_stage_of_inverts_replica_name(stage: str, index: int) -> None:
    name = replica_name(stage, index)
    assert stage_of(name) == stage
    assert (name == stage) == (index == 0)


def test_start_logged_appends_both_streams_with_the_given_environment(tmp_path: Path) -> None:
    code = "import os, sys; print(os.environ['MARK'], flush=True); print('err', file=sys.stderr)"
    stage = StageProcess("talker", 0, [sys.executable, "-c", code])
    log = tmp_path / "talker.log"
    for mark in ("first", "second"):  # a restart appends to its predecessor's log
        start_logged(stage, log, {"MARK": mark})
        assert stage.process is not None and stage.process.wait(30) == 0
    assert log.read_text().split() == ["first", "err", "second", "err"]


def test_upflag_value() -> None:
    assert build_parser().parse_args(["up"]).replicas == 1
    assert build_parser().parse_args(["up", "--replicas", "3"]).replicas == 3


def _up_stages(base: int, port: int, http: int, metrics: bool = False) -> list[StageProcess]:
    return stage_commands(Path("/m"), "127.0.0.1", port, base, None, metrics, 2, http_port=http)


@given(role=st.sampled_from(["base", "port", "http"]), offset=st.integers(0, 4))
@settings(max_examples=20, deadline=None)
def test_a_taken_port_is_named_with_the_flag_that_moves_it(role: str, offset: int) -> None:
    """Whichever port of an ``up --replicas 2`` stack another process listens on (a stage's:
    ``offset`` from the base picks which), ``up`` refuses to start, naming that port, the process
    that wanted it and the flag that moves it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = {"base": free_port(), "port": free_port(), "http": free_port()}
        ports[role] = taken - offset if role == "base" else taken
        stages = _up_stages(ports["base"], ports["port"], ports["http"])
        message = busy_port(stages)
    (name,) = [s.name for s in stages if taken in (p for _, p, _ in listeners(s))]
    flag = {"base": "--base-port", "port": "--port", "http": "--http-port"}[role]
    assert message is not None and message.startswith(f"port {taken} ({name}) is already in use on 127.0.0.1")
    assert flag in message
    assert (name == "gateway") == (role != "base")


def test_stage_ports_name_base_port_and_metrics_name_metrics() -> None:
    stages = _up_stages(51000, 52000, 53000, metrics=True)
    found = {(s.name, p): flag for s in stages for _, p, flag in listeners(s)}
    assert found[("talker", 51000)] == found[("decoder-2", 51004)] == "--base-port"
    assert found[("gateway", 52000)] == "--port" and found[("gateway", 53000)] == "--http-port"
    assert found[("talker", 9092)] == found[("gateway", 9091)] == "--metrics"
    assert {h for s in stages for h, p, _ in listeners(s) if p >= 9091 and p < 9100} == {"0.0.0.0"}


def test_stage_ports_on_the_metrics_ports_are_refused_naming_both_processes() -> None:
    """``up --replicas 2 --metrics --base-port 9088``: the stage ports run 9088-9092, the metrics
    ports 9091 on (the talker's 9092), so decoder-2's port is the talker's metrics port; ``up``
    refuses before starting anything, naming the port, both processes and the flag that moves
    it."""
    message = busy_port(_up_stages(9088, free_port(), free_port(), metrics=True))
    assert message == (
        "port 9092 is wanted by both talker and decoder-2 of this stack: "
        + "move the stage ports with --base-port (the stages use consecutive ports from it)"
    )


@given(base=st.integers(9080, 9100), replicas=st.integers(1, 3), metrics=st.booleans())
@settings(max_examples=30, deadline=None)
def test_up_refuses_exactly_the_stacks_whose_processes_want_one_port(
    base: int, replicas: int, metrics: bool
) -> None:
    stages = stage_commands(Path("/m"), "127.0.0.1", 50051, base, None, metrics, replicas, http_port=0)
    ports = [p for s in stages for _, p, _ in listeners(s)]
    repeated = sorted({p for p in ports if ports.count(p) > 1})
    message = busy_port(stages)
    if repeated:
        assert message is not None and "is wanted by both" in message
        assert int(message.split()[1]) in repeated
    else:
        assert message is None or "is already in use" in message  # a port this machine holds


def test_a_port_in_time_wait_is_not_taken() -> None:
    """A stack stopped a moment ago leaves connections in TIME_WAIT on its ports; the servers
    bind over them (SO_REUSEADDR), so ``up`` must not refuse them."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's servers do
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    assert not port_taken("127.0.0.1", port)
