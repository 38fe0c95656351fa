"""``qwen3-tts up``: the stage processes on this machine, on loopback, until interrupted.

One model (``--model DIR``, or the embedded dev checkpoint) is the classic four processes: talker,
decoder, speaker, gateway. Several (``--model DIR --model NAME=DIR2 ...``, or
``--dev-model-type voice_design,base,custom_voice``) run one talker per model, a speaker stage
for each Base model, and one decoder pool for all of them (their speech tokenizers must match:
the gateway checks), behind one gateway that serves each model by name. Registered voices last
across runs in the gateway's voice library (``--voices-db``, a SQLite file under ``.qwen3-tts/``
by default).

Word timestamps come from an aligner stage (``aligner_service``), one per stack whatever the
number of models: on by default on the embedded dev aligner checkpoint (random weights, like the
dev TTS checkpoint, created on first use in ``--dev-model-dir``), ``--aligner-model DIR`` for a
released Qwen3-ForcedAligner, ``--no-aligner`` for none (requests asking for timestamps then get
FAILED_PRECONDITION from the gateway).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .supervision import Supervisor

SHARED_HOST_ENV: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Environment defaults of every child: the model stages share this host's cores, each with all of
them (torch's default thread count), so that a lone stream's talker or decoder work uses the whole
machine. OpenMP workers then wait passively (sleep at once instead of spinning for a while after
each parallel region), so a stage that is between kernels leaves its cores to the stages that are
working instead of spinning on them. Variables already set in the environment win (compare
``OMP_WAIT_POLICY=ACTIVE qwen3-tts up``). See deploy/OPERATIONS.md, "CPU hosts"."""


def stage_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the stack's children: ``base`` plus :data:`SHARED_HOST_ENV` where
    ``base`` leaves those variables unset."""
    env = dict(base)
    for key, value in SHARED_HOST_ENV.items():
        if not env.get(key):
            env[key] = value
    return env


@dataclass
class StageProcess:
    """One child process of the local stack."""

    name: str
    port: int
    args: list[str]
    process: subprocess.Popen | None = None
    model: str | None = None
    """The served model a talker or speaker belongs to, by name (None: the decoder pool, the
    gateway, or the stages of a stack's one unnamed model)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ServedModel:
    """One model of the stack: a checkpoint directory and how the gateway serves it."""

    path: Path
    name: str | None = None
    """Its served name; None: the one its talker reports (the directory's name)."""
    clones: bool = True
    """Whether it gets a speaker stage (Base models)."""

    @property
    def served_name(self) -> str:
        return self.name or self.path.name


def parse_model_arg(text: str) -> ServedModel:
    """``--model`` of ``qwen3-tts up``: ``DIR`` or ``NAME=DIR`` (a name of letters, digits, '.',
    '_' and '-')."""
    name, sep, path = text.partition("=")
    if sep and name and "/" not in name and Path(name).name == name:
        return ServedModel(Path(path), name)
    return ServedModel(Path(text))


def _with_speakers(models: list[ServedModel]) -> list[ServedModel]:
    """One model keeps the classic speaker stage; among several, only Base models get one."""
    if len(models) == 1:
        return models
    result = []
    for model in models:
        config = model.path / "config.json"
        try:
            model_type = json.loads(config.read_text(encoding="utf-8")).get("tts_model_type")
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the checkpoint {config}: {exc}") from exc
        result.append(dataclasses.replace(model, clones=model_type == "base"))
    return result


def served_models(args: argparse.Namespace) -> list[ServedModel]:
    """The models ``qwen3-tts up`` serves: ``--model`` (repeatable), else the dev checkpoints of
    ``--dev-model-type`` (comma-separated types; each created on first use and named after its
    type when there are several)."""
    if args.model:
        models = [parse_model_arg(text) for text in args.model]
    else:
        from .dev_model import make_dev_model

        types = [t.strip() for t in args.dev_model_type.split(",") if t.strip()]
        models = []
        for model_type in types:
            path = args.dev_model_dir / model_type
            if not (path / "config.json").is_file():
                print(f"creating the dev checkpoint ({model_type}) in {path} ...", flush=True)
            make_dev_model(path, model_type, if_missing=True)
            models.append(ServedModel(path, model_type if len(types) > 1 else None))
    names = [m.served_name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"two models are named alike ({', '.join(names)}): name them, --model NAME=DIR")
    return _with_speakers([dataclasses.replace(m, path=m.path.resolve()) for m in models])


DEV_ALIGNER_SUBDIR = "forced_aligner"
"""The dev aligner checkpoint's folder under ``--dev-model-dir`` (beside the dev TTS types')."""


def aligner_checkpoint(args: argparse.Namespace) -> Path | None:
    """The aligner ``qwen3-tts up`` serves: None with ``--no-aligner``, ``--aligner-model``, else
    the dev aligner checkpoint (created on first use)."""
    if args.no_aligner:
        return None
    if args.aligner_model is not None:
        path = Path(args.aligner_model)
        if not (path / "config.json").is_file():
            raise ValueError(
                f"--aligner-model {path}: no config.json there (an aligner checkpoint directory)"
            )
        return path.resolve()
    from .dev_aligner import make_dev_aligner

    path = args.dev_model_dir / DEV_ALIGNER_SUBDIR
    if not (path / "config.json").is_file():
        print(f"creating the dev aligner checkpoint in {path} ...", flush=True)
    return Path(make_dev_aligner(path, if_missing=True)).resolve()


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_logged(stage: StageProcess, log: Path, env: Mapping[str, str]) -> None:
    """Start ``stage`` with environment ``env``, its stdout and stderr appended to ``log`` (a
    restarted process's output follows its predecessor's)."""
    with open(log, "ab") as out:  # the child holds its own descriptor
        stage.process = subprocess.Popen(stage.args, stdout=out, stderr=subprocess.STDOUT, env=env)


def start_in(stage: StageProcess, log_dir: Path, extra_env: Mapping[str, str] | None = None) -> None:
    """Start ``stage`` logging to ``log_dir/NAME.log``, with this environment plus ``extra_env``
    and one torch thread unless that says otherwise: for many processes on few cores (the
    chaos run, the tests), unlike ``up``, which gives each stage all cores."""
    env = os.environ.copy()
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env or {})
    start_logged(stage, log_dir / f"{stage.name}.log", env)


def on_free_ports(stages: list[StageProcess]) -> None:
    """Re-point every process of :func:`stage_commands` (which numbers ports consecutively from
    a base) at a free port, the gateway's targets at them, and the gateway's HTTP API (unless
    off) at one more (tests, chaos runs)."""
    for stage in stages:
        stage.port = free_port()
        stage.args[stage.args.index("--port") + 1] = str(stage.port)
    gateway = next(s for s in stages if s.name == "gateway")
    if "--http-port" in gateway.args:
        at = gateway.args.index("--http-port") + 1
        if gateway.args[at] != "0":
            gateway.args[at] = str(free_port())
    point_gateway(gateway, stages)


def point_gateway(gateway: StageProcess, stages: list[StageProcess]) -> None:
    """Set the gateway's target flags to the stage processes' addresses: ``--decoder-targets``
    and ``--aligner-targets`` (where the stack has an aligner), and, per model, its talkers and
    speaker (``--models``, or for one unnamed model ``--talker-targets`` /
    ``--speaker-targets``)."""

    def addresses(kind: str, model: str | None) -> list[str]:
        return [s.address for s in stages if stage_of(s.name) == kind and s.model == model]

    def put(flag: str, value: str) -> None:
        gateway.args[gateway.args.index(flag) + 1] = value

    put("--decoder-targets", ",".join(addresses("decoder", None)))
    if "--aligner-targets" in gateway.args:
        put("--aligner-targets", ",".join(addresses("aligner", None)))
    if "--models" not in gateway.args:
        put("--talker-targets", ",".join(addresses("talker", None)))
        put("--speaker-targets", ",".join(addresses("speaker", None)))
        return
    from gateway.config import ModelRoute, format_model_routes

    names = list(dict.fromkeys(s.model for s in stages if s.model is not None))
    routes = [ModelRoute(n, tuple(addresses("talker", n)), tuple(addresses("speaker", n))) for n in names]
    put("--models", format_model_routes(routes))


def replica_name(stage: str, index: int) -> str:
    """Process name of replica ``index`` (0-based) of ``stage``: talker, talker-2, talker-3, ..."""
    return stage if index == 0 else f"{stage}-{index + 1}"


def replica_group(stage: StageProcess) -> str:
    """The processes ``stage`` is one replica among: its stage, and its model's name where it
    serves a named one (``talker (model base)``). ``up`` stops when every replica of a group is
    lost: one model's talkers, the decoder pool, a Base model's speakers."""
    kind = stage_of(stage.name)
    return kind if stage.model is None else f"{kind} (model {stage.model})"


def stage_of(name: str) -> str:
    """The stage a process name of :func:`replica_name` runs: talker-2 -> talker."""
    return name.split("-")[0]


def stage_commands(
    model: Path | Sequence[ServedModel],
    host: str,
    port: int,
    base_port: int,
    device: str | None,
    metrics: bool,
    replicas: int = 1,
    http_port: int = 8000,
    voices_db: str | None = None,
    aligner: Path | None = None,
) -> list[StageProcess]:
    """Command lines of the stages and the gateway (the same flags the deploy files use), in
    start order: the first model's talker, the decoder, its speaker; the other models' talkers
    and speakers; the extra talker and decoder replicas; the aligner (``aligner``: its
    checkpoint directory; None: no aligner stage); the gateway last.

    Ports: consecutive from ``base_port`` in that order (one model: talker ``base_port``,
    decoder ``+1``, speaker ``+2``, the aligner ``+3``; replica k >= 2 of the talker at
    ``base_port + 2k - 1``, of the decoder at ``base_port + 2k``, and the aligner after the last
    replica), so that adding the aligner moves no other port; the one gateway's HTTP API and
    playground at ``http_port`` (0: off). Metrics (``metrics``): gateway 9091, the others 9092
    on in start order. ``model``: one checkpoint directory, or the served models.
    ``voices_db``: the gateway's voice library (None: the gateway's default, a temporary
    one)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    models = [ServedModel(model)] if isinstance(model, Path) else list(model)
    if not models:
        raise ValueError("no model to serve")
    py = [sys.executable, "-m"]
    # No --threads: each stage gets all cores, sharing them through passive OpenMP waiting
    # (SHARED_HOST_ENV).
    dev = ["--device", device] if device else []
    named = len(models) > 1 or models[0].name is not None
    stages: list[StageProcess] = []
    order = _start_order(models, replicas)
    if aligner is not None:
        order.append(("aligner", ServedModel(aligner), 0))
    for index, (kind, served, replica) in enumerate(order):
        stage_port = base_port + index
        model_name = served.served_name if named and kind in ("talker", "speaker") else None
        stages.append(
            StageProcess(
                _process_name(kind, model_name if len(models) > 1 else None, replica),
                stage_port,
                py
                + [
                    f"{kind}_service",
                    "--model",
                    str(served.path),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(stage_port),
                    *dev,
                    *(["--metrics-port", str(9092 + index)] if metrics else []),
                ],
                model=model_name,
            )
        )
    targets = ["--models", ""] if named else ["--talker-targets", "", "--speaker-targets", ""]
    if aligner is not None:
        targets += ["--aligner-targets", ""]
    gateway = StageProcess(
        "gateway",
        port,
        py
        + [
            "gateway",
            "--host",
            host,
            "--port",
            str(port),
            *targets,
            "--decoder-targets",
            "",
            "--http-port",
            str(http_port),
            *(["--metrics-port", "9091"] if metrics else []),
            *(["--voices-db", voices_db] if voices_db else []),
        ],
    )
    point_gateway(gateway, stages)
    return [*stages, gateway]


def _start_order(models: list[ServedModel], replicas: int) -> list[tuple[str, ServedModel, int]]:
    """(stage, model, replica index) of every talker, decoder and speaker process in start order
    (see :func:`stage_commands`); the decoder pool loads the first model's speech tokenizer."""
    first = models[0]
    order = [("talker", first, 0), ("decoder", first, 0)]
    order += [("speaker", first, 0)] if first.clones else []
    for other in models[1:]:
        order += [("talker", other, 0)] + ([("speaker", other, 0)] if other.clones else [])
    for k in range(1, replicas):
        order += [("talker", m, k) for m in models] + [("decoder", first, k)]
    return order


def _process_name(stage: str, model: str | None, index: int) -> str:
    """talker, talker-2 (one model); talker-base, talker-base-2 (several)."""
    return replica_name(stage if model is None else f"{stage}-{model}", index)


def is_replicated(name: str) -> bool:
    """Whether process ``name`` is a talker or decoder replica (``up --replicas`` runs N each)."""
    return stage_of(name) in ("talker", "decoder")


PORT_FLAGS = {"--port": "--base-port", "--http-port": "--http-port", "--metrics-port": "--metrics"}
"""Each listening flag of a stage process -> the ``up`` flag that moves that port (the gateway's
own ``--port`` is ``up``'s ``--port``)."""

PORT_ADVICE = {
    "--base-port": "move the stage ports with --base-port (the stages use consecutive ports from it)",
    "--port": "move the gateway with --port",
    "--http-port": "move the HTTP API with --http-port (0 turns it off)",
    "--metrics": "the metrics ports are fixed (9091 on): run without --metrics",
}


def listeners(stage: StageProcess) -> list[tuple[str, int, str]]:
    """(host, port, the ``up`` flag that moves it) of every port ``stage`` will listen on."""
    args = stage.args
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    found = []
    for flag, up_flag in PORT_FLAGS.items():
        if flag in args and int(port := args[args.index(flag) + 1]):
            if flag == "--port" and stage_of(stage.name) == "gateway":
                up_flag = "--port"
            # the metrics endpoint binds every interface (ServerConfig.metrics_host)
            found.append(("0.0.0.0" if flag == "--metrics-port" else host, int(port), up_flag))
    return found


def port_taken(host: str, port: int) -> bool:
    """Whether a listener already holds ``port`` on ``host`` (TIME_WAIT leftovers do not count,
    as they do not stop the servers, which bind with SO_REUSEADDR)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return True
    return False


def busy_port(stages: list[StageProcess]) -> str | None:
    """Why the stack cannot start here, naming the first port two of its own processes want or
    one already taken, and the flag that moves it; None when every port is free (two stacks on
    one machine must not share ports: requests would reach the other stack's processes).

    Its own ports can meet when ``--base-port`` puts the consecutive stage ports on the fixed
    metrics ports (9091 on): the second process to bind would fail after the first had started."""
    found = [(stage.name, host, port, flag) for stage in stages for host, port, flag in listeners(stage)]
    wanted: dict[int, tuple[str, str]] = {}
    for name, _, port, flag in found:
        if port in wanted:
            other, other_flag = wanted[port]
            movable = other_flag if flag == "--metrics" else flag
            return f"port {port} is wanted by both {other} and {name} of this stack: {PORT_ADVICE[movable]}"
        wanted[port] = (name, flag)
    for name, host, port, flag in found:
        if port_taken(host, port):
            return f"port {port} ({name}) is already in use on {host} (another `qwen3-tts up`?): {PORT_ADVICE[flag]}"
    return None


def is_serving(address: str, timeout: float = 1.0) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def wait_until_serving(stages: list[StageProcess], timeout: float, stop: StopRequest | None = None) -> None:
    """Block until every stage reports SERVING (or ``stop`` is requested); raise if one exits or
    the timeout passes."""
    deadline = time.monotonic() + timeout
    pending = list(stages)
    while pending and not (stop and stop.requested):
        for stage in list(pending):
            assert stage.process is not None
            if stage.process.poll() is not None:
                if stop is not None and stop.settle():
                    return
                raise RuntimeError(
                    f"{stage.name} exited with code {stage.process.returncode} during start-up"
                )
            if is_serving(stage.address):
                pending.remove(stage)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"not serving after {timeout:.0f} s: {', '.join(s.name for s in pending)}")
        time.sleep(0.2)


class StopRequest:
    """SIGINT / SIGTERM of the stack's parent: a stop the user asked for (exit 0, not an error).

    A Ctrl-C in a terminal reaches every process of the foreground group, the children included:
    they begin their own graceful shutdown at the same moment, so a child exiting is expected
    then, and the parent gives them a moment before it sends its own SIGTERM (a second signal
    would make them cancel in-flight calls instead of draining).
    """

    SETTLE_SECONDS = 1.0

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signal = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def settle(self) -> bool:
        """After a child exited: whether that was part of a requested stop (waits briefly for
        the parent's signal, which can arrive just after the child's)."""
        deadline = time.monotonic() + self.SETTLE_SECONDS
        while not self.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.requested


def stop_all(stages: list[StageProcess], grace: float = 30.0, already_signalled: bool = False) -> None:
    """SIGTERM every child (gateway first so it drains), then wait; SIGKILL stragglers.

    ``already_signalled``: the children got the same signal (a terminal's Ctrl-C): give them a
    moment to exit by themselves before the SIGTERM."""
    if already_signalled:
        deadline = time.monotonic() + StopRequest.SETTLE_SECONDS
        while time.monotonic() < deadline and any(s.process and s.process.poll() is None for s in stages):
            time.sleep(0.05)
    for stage in reversed(stages):
        if stage.process is not None and stage.process.poll() is None:
            stage.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for stage in stages:
        if stage.process is None:
            continue
        try:
            stage.process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stage.process.kill()
            stage.process.wait()


def ready_message(args: argparse.Namespace, models: list[ServedModel], aligner: Path | None = None) -> str:
    """What ``qwen3-tts up`` prints once every process is serving (``aligner``: the aligner
    stage's checkpoint, None without one)."""
    http = ""
    name = models[0].served_name
    if args.http_port:
        http = (
            f"  playground: http://127.0.0.1:{args.http_port}/\n"
            f"  curl http://127.0.0.1:{args.http_port}/v1/audio/speech -H 'Content-Type: application/json' "
            f'-d \'{{"model": "{name}", "input": "Hello world.", "voice": "alloy", '
            f'"response_format": "wav"}}\' -o hello.wav\n'
        )
    served = ", ".join(f"{m.served_name} ({m.path})" for m in models)
    replicas = args.replicas
    return (
        f"\nqwen3-tts stack is up: gateway {args.host}:{args.port} "
        + (f"(model {models[0].path})" if len(models) == 1 else f"(models {served}; default {name})")
        + (f", HTTP API {args.host}:{args.http_port}" if args.http_port else "")
        + (f", word timestamps (aligner {aligner})" if aligner is not None else ", no word timestamps")
        + "\n"
        f'  qwen3-tts say --gateway 127.0.0.1:{args.port} "Hello world." -o hello.wav'
        + (" --captions hello.srt" if aligner is not None else "")
        + "\n"
        f"  grpcurl -plaintext 127.0.0.1:{args.port} list\n"
        f"{http}"
        + (
            f"{replicas} talker and {replicas} decoder replicas: one that exits is restarted "
            "(its streams fail over).\n"
            if replicas > 1
            else ""
        )
        + "Ctrl-C stops it."
    )


def run_local_stack(args: argparse.Namespace) -> int:
    models = served_models(args)
    aligner = aligner_checkpoint(args)
    replicas = args.replicas
    stages = stage_commands(
        models,
        args.host,
        args.port,
        args.base_port,
        args.device,
        args.metrics,
        replicas,
        http_port=args.http_port,
        voices_db=args.voices_db,
        aligner=aligner,
    )
    busy = busy_port(stages)
    if busy is not None:
        print(f"qwen3-tts up: {busy}", file=sys.stderr)
        return 2
    env = stage_environment(os.environ)
    stop = StopRequest()

    def start(stage: StageProcess) -> None:
        stage.process = subprocess.Popen(stage.args, env=env)

    try:
        for stage in stages:
            start(stage)
        groups = {stage.name: replica_group(stage) for stage in stages}
        supervisor = Supervisor(stages, groups.__getitem__, start, is_serving)
        return supervisor.run(
            stop, lambda: print(ready_message(args, models, aligner), flush=True), start_timeout=600
        )
    finally:
        stop_all(stages, already_signalled=stop.signal is signal.SIGINT)
