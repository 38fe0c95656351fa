"""``qwen3-tts up``: the four stage processes on this machine, on loopback, until interrupted."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
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

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


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
    for kind in ("talker", "decoder", "speaker"):
        targets = [s.address for s in stages if stage_of(s.name) == kind]
        gateway.args[gateway.args.index(f"--{kind}-targets") + 1] = ",".join(targets)


def replica_name(stage: str, index: int) -> str:
    """Process name of replica ``index`` (0-based) of ``stage``: talker, talker-2, talker-3, ..."""
    return stage if index == 0 else f"{stage}-{index + 1}"


def stage_of(name: str) -> str:
    """The stage a process name of :func:`replica_name` runs: talker-2 -> talker."""
    return name.split("-")[0]


def stage_commands(
    model: Path,
    host: str,
    port: int,
    base_port: int,
    device: str | None,
    metrics: bool,
    replicas: int = 1,
    http_port: int = 8000,
) -> list[StageProcess]:
    """Command lines of the stages and the gateway (the same flags the deploy files use), in
    start order: talker, decoder, speaker, the extra talker and decoder replicas, gateway last.

    Ports: talker ``base_port``, decoder ``+1``, speaker ``+2``; replica k >= 2 of the talker at
    ``base_port + 2k - 1``, of the decoder at ``base_port + 2k``; the one gateway's HTTP API and
    playground at ``http_port`` (0: off). Metrics (``metrics``): gateway 9091, talker 9092,
    decoder 9093, speaker 9094, extra replicas 9095 on in start order."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    py = [sys.executable, "-m"]
    # No --threads: each stage gets all cores, sharing them through passive OpenMP waiting
    # (SHARED_HOST_ENV).
    dev = ["--device", device] if device else []
    ports = {("talker", 0): base_port, ("decoder", 0): base_port + 1, ("speaker", 0): base_port + 2}
    for k in range(1, replicas):
        ports[("talker", k)] = base_port + 2 * k + 1
        ports[("decoder", k)] = base_port + 2 * k + 2
    order = [("talker", 0), ("decoder", 0), ("speaker", 0)]
    order += [(stage, k) for k in range(1, replicas) for stage in ("talker", "decoder")]
    stages: list[StageProcess] = []
    for metrics_port, (stage, k) in enumerate(order, start=9092):
        stage_port = ports[(stage, k)]
        stages.append(
            StageProcess(
                replica_name(stage, k),
                stage_port,
                py
                + [
                    f"{stage}_service",
                    "--model",
                    str(model),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(stage_port),
                    *dev,
                    *(["--metrics-port", str(metrics_port)] if metrics else []),
                ],
            )
        )

    def targets(stage: str) -> str:
        return ",".join(f"127.0.0.1:{p}" for (name, _), p in ports.items() if name == stage)

    stages.append(
        StageProcess(
            "gateway",
            port,
            py
            + [
                "gateway",
                "--host",
                host,
                "--port",
                str(port),
                "--talker-targets",
                targets("talker"),
                "--decoder-targets",
                targets("decoder"),
                "--speaker-targets",
                targets("speaker"),
                "--http-port",
                str(http_port),
                *(["--metrics-port", "9091"] if metrics else []),
            ],
        )
    )
    return stages


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
    """Why the stack cannot start here, naming the first port already taken and the flag that
    moves it, or None when every port is free (two stacks on one machine must not share ports:
    requests would reach the other stack's processes)."""
    for stage in stages:
        for host, port, flag in listeners(stage):
            if port_taken(host, port):
                return (
                    f"port {port} ({stage.name}) is already in use on {host} (another "
                    f"`qwen3-tts up`?): {PORT_ADVICE[flag]}"
                )
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


def run_local_stack(args: argparse.Namespace) -> int:
    model = args.model
    if model is None:
        from .dev_model import make_dev_model

        model = args.dev_model_dir / args.dev_model_type
        if not (model / "config.json").is_file():
            print(f"creating the dev checkpoint ({args.dev_model_type}) in {model} ...", flush=True)
        make_dev_model(model, args.dev_model_type, if_missing=True)
    replicas = args.replicas
    stages = stage_commands(
        model.resolve(),
        args.host,
        args.port,
        args.base_port,
        args.device,
        args.metrics,
        replicas,
        http_port=args.http_port,
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
        supervisor = Supervisor(stages, stage_of, start, is_serving)
        return supervisor.run(
            stop, lambda: print(_banner(args, model, replicas), flush=True), start_timeout=600
        )
    finally:
        stop_all(stages, already_signalled=stop.signal is signal.SIGINT)


def _banner(args: argparse.Namespace, model: Path, replicas: int) -> str:
    """What ``up`` prints once every process serves."""
    http = ""
    if args.http_port:
        http = (
            f"  playground: http://127.0.0.1:{args.http_port}/\n"
            f"  curl http://127.0.0.1:{args.http_port}/v1/audio/speech -H 'Content-Type: application/json' "
            f'-d \'{{"model": "qwen3-tts", "input": "Hello world.", "voice": "alloy", '
            f'"response_format": "wav"}}\' -o hello.wav\n'
        )
    return (
        f"\nqwen3-tts stack is up: gateway {args.host}:{args.port} (model {model})"
        + (f", HTTP API {args.host}:{args.http_port}" if args.http_port else "")
        + "\n"
        f'  qwen3-tts say --gateway 127.0.0.1:{args.port} "Hello world." -o hello.wav\n'
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
