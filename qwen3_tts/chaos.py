"""A chaos run of the local stack: stage replicas killed and frozen under streaming load, and
every stream checked against its undisturbed audio.

:func:`run_chaos` starts a gateway and ``replicas`` talkers and decoders on free loopback
ports, synthesizes each of a few seeded requests once undisturbed (the references), then runs a
closed loop of ``streams`` concurrent streams for ``duration`` seconds while it SIGKILLs one
talker or decoder replica every ``kill_every`` seconds (restarting it at once) and, once, stops
one with SIGSTOP for ``stop_seconds``. A replica is only hit while every other replica of its
stage is up and SERVING, so one of each stage is always alive. The :class:`ChaosReport` says
which streams failed or differed from their reference, which faults happened, the gateway's
failovers and the extra delay at each (from its log), and the longest wait between audio chunks
a client saw.

Operators: ``python scripts/chaos.py`` (see ``--help``); tests: the chaos integration test.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

from .local_stack import (
    StageProcess,
    is_replicated,
    is_serving,
    on_free_ports,
    stage_commands,
    stage_of,
    start_in,
    stop_all,
    wait_until_serving,
)

TOLERANCE = 1e-4
"""Largest sample difference accepted between a stream and its reference (the decoder's
streaming/batching tolerance, as the end-to-end tests use)."""

_RESUMED = re.compile(r"failover (\w+) request \S+: resumed after ([0-9.]+) s")
_FAILOVER = re.compile(r"failover (\w+) request \S+: (ok|refused|exhausted|not_replayable)\b")


@dataclass(frozen=True)
class ChaosConfig:
    """What :func:`run_chaos` does (defaults: the issue's 60 s run)."""

    duration: float = 60.0
    """Seconds of closed-loop load with faults."""
    streams: int = 8
    """Concurrent streams (each starts a new one when its last one ends)."""
    replicas: int = 2
    """Talker and decoder processes each (>= 2)."""
    kill_every: float = 10.0
    """A replica gets SIGKILL (and is restarted) this often; 0 = never."""
    stop_at: float | None = 25.0
    """When a replica gets SIGSTOP (None = never)."""
    stop_seconds: float = 10.0
    """How long it stays stopped (then SIGCONT)."""
    requests: int = 4
    """Distinct seeded requests the streams cycle through."""
    max_new_tokens: int = 160
    """Length bound of each stream (frames + 1; 12.5 frames per second of audio)."""
    stream_timeout: float = 120.0
    """Client deadline of one stream."""


@dataclass
class StreamResult:
    """One stream of the closed loop."""

    request: int
    status: str
    detail: str = ""
    max_diff: float | None = None
    longest_gap: float = 0.0


@dataclass
class ChaosReport:
    """What a chaos run observed (see the module doc)."""

    streams: list[StreamResult] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    failovers: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(stage, result) -> count, from the gateway's log."""
    failover_delays: list[float] = field(default_factory=list)
    """Seconds from a stage call's failure to the replacement's first new output."""

    @property
    def failed(self) -> list[StreamResult]:
        return [s for s in self.streams if s.status != "OK"]

    @property
    def mismatched(self) -> list[StreamResult]:
        return [
            s for s in self.streams if s.status == "OK" and (s.max_diff is None or s.max_diff > TOLERANCE)
        ]

    def summary(self) -> str:
        def quantiles(values: list[float]) -> str:
            if not values:
                return "n/a"
            p50, p95 = np.percentile(values, [50, 95])
            return f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"

        lines = [
            f"streams: {len(self.streams)} ({len(self.failed)} failed, {len(self.mismatched)} differ from "
            f"their reference by more than {TOLERANCE:g})",
            f"faults: {len(self.faults)}",
            *(f"  {fault}" for fault in self.faults),
            "failovers: "
            + (
                ", ".join(f"{stage} {result} {n}" for (stage, result), n in sorted(self.failovers.items()))
                or "none"
            ),
            f"extra delay at a failover (gateway): {quantiles(self.failover_delays)}",
            f"longest wait between audio chunks per stream (client): {quantiles([s.longest_gap for s in self.streams])}",
        ]
        for stream in self.failed + self.mismatched:
            lines.append(
                f"  request {stream.request}: {stream.status} {stream.detail} max diff {stream.max_diff}"
            )
        return "\n".join(lines)


class _Stack:
    """The processes of the run: started with logs, killed, stopped, restarted."""

    def __init__(self, model: Path, replicas: int, log_dir: Path) -> None:
        # No HTTP API: the run speaks gRPC only.
        stages = stage_commands(model, "127.0.0.1", 0, 0, None, False, replicas, http_port=0)
        on_free_ports(stages)
        # No speaker: the seeded requests use preset speakers or instructions, and one torch
        # process fewer leaves the cores to the replicas.
        self.stages = [s for s in stages if s.name != "speaker"]
        gateway = self.stages[-1]
        at = gateway.args.index("--speaker-targets")
        del gateway.args[at : at + 2]
        self.by_name = {s.name: s for s in self.stages}
        self.log_dir = log_dir
        self.frozen: set[str] = set()
        self.lock = threading.Lock()

    @property
    def gateway(self) -> StageProcess:
        return self.by_name["gateway"]

    def start(self, stage: StageProcess) -> None:
        start_in(stage, self.log_dir)

    def replicas(self) -> list[StageProcess]:
        return [s for s in self.stages if is_replicated(s.name)]

    def siblings_up(self, victim: StageProcess) -> bool:
        """Whether every other replica of ``victim``'s stage runs, is not frozen, and serves."""
        kind = stage_of(victim.name)
        others = [s for s in self.replicas() if stage_of(s.name) == kind and s is not victim]
        return bool(others) and all(
            s.process is not None
            and s.process.poll() is None
            and s.name not in self.frozen
            and is_serving(s.address, timeout=0.5)
            for s in others
        )

    def pick(self, turn: int) -> StageProcess | None:
        """The replica to hit at ``turn`` (rotating), or None if none may be hit now."""
        replicas = self.replicas()
        for i in range(len(replicas)):
            victim = replicas[(turn + i) % len(replicas)]
            if victim.name not in self.frozen and self.siblings_up(victim):
                return victim
        return None

    def gateway_log(self) -> str:
        return (self.log_dir / "gateway.log").read_text(errors="replace")


def _faults(
    stack: _Stack, config: ChaosConfig, started: float, done: threading.Event, report: ChaosReport
) -> None:
    """The fault schedule (a thread: it blocks on health checks and process waits)."""
    kills = (
        [started + config.kill_every * k for k in range(1, int(config.duration / config.kill_every) + 1)]
        if config.kill_every > 0
        else []
    )
    events: list[tuple[float, str]] = [(t, "kill") for t in kills if t < started + config.duration]
    if config.stop_at is not None and config.stop_at < config.duration:
        events.append((started + config.stop_at, "stop"))
    events.sort()
    resume: tuple[float, StageProcess] | None = None
    turn = 0
    while not done.is_set() and (events or resume):
        now = time.monotonic()
        if resume is not None and now >= resume[0]:
            frozen = resume[1]
            assert frozen.process is not None
            frozen.process.send_signal(signal.SIGCONT)
            stack.frozen.discard(frozen.name)
            report.faults.append(f"{now - started:5.1f} s: SIGCONT {frozen.name}")
            resume = None
            continue
        if events and now >= events[0][0]:
            victim = stack.pick(turn)
            if victim is None:  # a sibling is still restarting: try again shortly
                done.wait(0.25)
                continue
            _, kind = events.pop(0)
            turn += 1
            assert victim.process is not None
            if kind == "kill":
                victim.process.kill()
                victim.process.wait()
                stack.start(victim)
                report.faults.append(f"{now - started:5.1f} s: SIGKILL {victim.name} (restarted)")
            else:
                victim.process.send_signal(signal.SIGSTOP)
                stack.frozen.add(victim.name)
                resume = (now + config.stop_seconds, victim)
                report.faults.append(
                    f"{now - started:5.1f} s: SIGSTOP {victim.name} for {config.stop_seconds:g} s"
                )
            continue
        done.wait(0.05)
    if resume is not None:  # never leave a process stopped
        assert resume[1].process is not None
        resume[1].process.send_signal(signal.SIGCONT)
        stack.frozen.discard(resume[1].name)


def _requests(info: tts_pb2.ModelInfo, config: ChaosConfig) -> list[tts_pb2.SynthesizeRequest]:
    requests = []
    for i in range(config.requests):
        request = tts_pb2.SynthesizeRequest(
            text=f"Chaos stream number {i}. The quick brown fox jumps over the lazy dog, twice over.",
            sampling=tts_pb2.SamplingOptions(seed=1000 + i, max_new_tokens=config.max_new_tokens),
            output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
        )
        if info.speakers:
            request.speaker = info.speakers[i % len(info.speakers)].name
        elif info.instruct_supported:
            request.instruct = "A calm, clear voice."
        else:
            raise ValueError(
                f"chaos runs need a custom_voice or voice_design checkpoint, not {info.model_type}"
            )
        requests.append(request)
    return requests


async def _stream(
    stub: tts_pb2_grpc.TextToSpeechStub, request: tts_pb2.SynthesizeRequest, timeout: float
) -> tuple[str, str, np.ndarray, float]:
    """(status, detail, audio, longest gap between audio chunks) of one stream."""
    pieces: list[np.ndarray] = []
    last, gap = None, 0.0
    try:
        async for response in stub.Synthesize(request, timeout=timeout):
            if response.WhichOneof("payload") == "audio":
                now = time.monotonic()
                if last is not None:
                    gap = max(gap, now - last)
                last = now
                pieces.append(np.frombuffer(response.audio.data, dtype="<f4"))
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details() or "", np.zeros(0, np.float32), gap
    return "OK", "", np.concatenate(pieces) if pieces else np.zeros(0, np.float32), gap


def _compare(audio: np.ndarray, reference: np.ndarray) -> float | None:
    if audio.shape != reference.shape:
        return None
    return float(np.abs(audio - reference).max()) if audio.size else 0.0


async def _load(stack: _Stack, config: ChaosConfig, report: ChaosReport) -> None:
    async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        info = await stub.GetModelInfo(tts_pb2.GetModelInfoRequest(), timeout=30)
        requests = _requests(info, config)
        references = []
        for request in requests:
            status, detail, audio, _ = await _stream(stub, request, config.stream_timeout)
            if status != "OK":
                raise RuntimeError(f"reference stream failed before any fault: {status} {detail}")
            references.append(audio)
        started = time.monotonic()
        done = threading.Event()
        faults = asyncio.create_task(asyncio.to_thread(_faults, stack, config, started, done, report))

        async def worker(index: int) -> None:
            n = index
            while time.monotonic() - started < config.duration:
                which = n % len(requests)
                status, detail, audio, gap = await _stream(stub, requests[which], config.stream_timeout)
                diff = _compare(audio, references[which]) if status == "OK" else None
                report.streams.append(StreamResult(which, status, detail, diff, gap))
                n += config.streams

        try:
            await asyncio.gather(*(worker(i) for i in range(config.streams)))
        finally:
            done.set()
            await faults


def run_chaos(model: Path, log_dir: Path, config: ChaosConfig | None = None) -> ChaosReport:
    """Run the chaos scenario of ``config`` against a fresh local stack of ``model`` (logs in
    ``log_dir``) and report what happened; the stack is stopped afterwards."""
    config = config or ChaosConfig()
    if config.replicas < 2:
        raise ValueError("a chaos run needs at least 2 replicas per stage")
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = _Stack(model, config.replicas, log_dir)
    report = ChaosReport()
    try:
        for stage in stack.stages:
            stack.start(stage)
        wait_until_serving(stack.stages, timeout=300)
        asyncio.run(_load(stack, config, report))
    finally:
        for stage in stack.stages:  # a frozen process would not drain
            if stage.process is not None and stage.process.poll() is None:
                stage.process.send_signal(signal.SIGCONT)
        stop_all(stack.stages, grace=20)
    log = stack.gateway_log()
    report.failovers.update((m.group(1), m.group(2)) for m in _FAILOVER.finditer(log))
    report.failover_delays = [float(m.group(2)) for m in _RESUMED.finditer(log)]
    return report


__all__ = ["TOLERANCE", "ChaosConfig", "ChaosReport", "StreamResult", "run_chaos"]
