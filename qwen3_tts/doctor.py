"""``qwen3-tts doctor``: what a host can serve, checked before serving.

One run on a new host (GPU or CPU) loads the talker and the decoder of a checkpoint (``--model``,
or a dev checkpoint written at the released dimensions), captures every talker and decoder bucket
(the CPU emulation of the graphs on CPU), and reports:

* the environment: torch and CUDA versions, the driver, a C compiler and Python headers for
  Triton, the device model and memory;
* the graph-path checks of every bucket (``talker_service.engine.self_check``,
  ``decoder_service.model.self_check``: the same checks a stage runs in short form at startup);
* the talker's step time per batch bucket, the decoder's chunk time per (batch, frames) bucket,
  and the streams each stage keeps at real time;
* memory: weights, KV cache, graph pools, peak; and the device's memory plan (tts_common.memory_plan).

Every check passes or fails with a reason; ``--json`` writes the whole report; the exit status is
1 when any check fails. The stages are imported here, as ``qwen3-tts up`` runs them: this
command is a client of every stage, never part of one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tts_common.cpu_info import cpu_identity
from tts_common.memory import format_bytes
from tts_common.memory_plan import CUDA_CONTEXT_BYTES, MemoryPlan, StageShare, plan_device
from tts_common.precision import resolve_dtype
from tts_common.self_check import CheckFailedError, CheckResult, run_check, step_path

FRAME_RATE_HZ = 12.5
"""Codec frames per second of the 12 Hz tokenizer (one talker step per frame per stream)."""


@dataclass
class DoctorOptions:
    """What ``qwen3-tts doctor`` checks (its command-line flags)."""

    model: Path | None = None
    """Checkpoint directory; None = a dev checkpoint of ``size`` written to a temporary folder."""
    device: str = "cpu"
    dtype: str | None = None
    """A ``--dtype`` value (``auto`` resolved as the stages resolve it); None: bfloat16 on CUDA,
    float32 on CPU."""
    size: str | None = None
    """Dev checkpoint dims (dev, 0b6, 1b7); None: 1b7 on CUDA, dev on CPU."""
    max_slots: int | None = None
    """Talker slots; None: 64 on CUDA, 4 on CPU."""
    max_seq_len: int = 2048
    timed_steps: int = 5
    decoder_batch_buckets: tuple[int, ...] | None = None
    """None: the decoder server's buckets."""
    decoder_frame_buckets: tuple[int, ...] | None = None
    decoder_graph_memory: int | None = None
    """The decoder's ``--graph-memory`` (bytes, 0 = no bound); None: the decoder server's default."""


@dataclass
class DoctorReport:
    """Everything the doctor found (``to_dict`` is the ``--json`` report)."""

    device: str
    environment: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    talker: dict[str, Any] = field(default_factory=dict)
    decoder: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    plan: MemoryPlan | None = None

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "device": self.device,
            "environment": self.environment,
            "checks": [c.to_dict() for c in self.checks],
            "talker": self.talker,
            "decoder": self.decoder,
            "memory": self.memory,
            "plan": None if self.plan is None else self.plan.to_dict(),
        }


# --- environment ---------------------------------------------------------------------------------
def _driver_version() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def environment(device: torch.device) -> dict[str, Any]:
    """Versions, compiler and device facts (no check: see :func:`environment_checks`)."""
    compiler = next(
        (shutil.which(c) for c in (os.environ.get("CC", ""), "cc", "gcc", "clang") if c and shutil.which(c)),
        None,
    )
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "cuda_available": torch.cuda.is_available(),
        "driver": _driver_version(),
        "c_compiler": compiler or "",
        "python_headers": str(headers) if headers.is_file() else "",
        "cpu": cpu_identity(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = ""
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        env.update(
            device_name=props.name,
            device_memory=total,
            device_free=free,
            capability=f"{props.major}.{props.minor}",
        )
    else:
        from tts_common.memory import available_memory

        env.update(device_name=env["cpu"], device_free=available_memory("cpu"))
    return env


def environment_checks(device: torch.device, env: dict[str, Any]) -> list[CheckResult]:
    """The device is usable; on CUDA, Triton finds a C compiler and Python's headers."""

    def usable() -> dict[str, Any]:
        if device.type == "cuda" and not env["cuda_available"]:
            raise CheckFailedError(
                f"--device {device} but torch {env['torch']} sees no CUDA device (driver {env['driver'] or 'not found'})"
            )
        return {"device_name": env["device_name"]}

    def compiler() -> dict[str, Any]:
        if device.type == "cuda" and not (env["c_compiler"] and env["python_headers"]):
            missing = "a C compiler (cc/gcc)" if not env["c_compiler"] else "Python.h (python3-dev)"
            raise CheckFailedError(
                f"Triton compiles FlexAttention at startup and needs {missing}; install it or use deploy/Dockerfile"
            )
        return {"c_compiler": env["c_compiler"], "needed": device.type == "cuda"}

    return [run_check("environment.device", usable), run_check("environment.c_compiler", compiler)]


# --- timing helpers ------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


# --- talker --------------------------------------------------------------------------------------
def _talker_slots(options: DoctorOptions, device: torch.device) -> int:
    """The talker slots the doctor checks (``--max-slots``, else 64 on CUDA and 4 on CPU)."""
    return options.max_slots or (64 if device.type == "cuda" else 4)


def check_talker(
    options: DoctorOptions, model_dir: Path, device: torch.device, dtype: torch.dtype, report: DoctorReport
) -> None:
    """Load the talker, capture and check every bucket, time a step per bucket."""
    from talker_service.engine import EngineConfig, TalkerEngine
    from talker_service.engine.self_check import graph_checks, prefill_rows, step_rows
    from talker_service.model.loader import TalkerModel

    loaded: dict[str, Any] = {}
    emulate = device.type != "cuda"
    slots = _talker_slots(options, device)

    def load() -> dict[str, Any]:
        model = TalkerModel.from_checkpoint(model_dir, device, dtype)
        # The engine's own set-up (KV plan, kernels), on the eager path: the graphs are built below.
        config = EngineConfig(
            max_slots=slots,
            max_seq_len=options.max_seq_len,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            cuda_graphs="off",
        )
        engine = TalkerEngine(model, config)
        loaded.update(model=model, engine=engine)
        return {"slots": engine.config.max_slots, "buckets": list(engine.config.graph_buckets)}

    report.checks.append(run_check("talker.load", load))
    if "engine" not in loaded:
        return
    model, engine = loaded["model"], loaded["engine"]
    runner = engine.runner
    runner.config = dataclasses.replace(engine.config, cuda_graphs="auto", emulate_cuda_graphs=emulate)

    def capture() -> dict[str, Any]:
        loaded["graphs"] = runner.build_graphs()
        return {"mode": loaded["graphs"].report.mode, "buckets": len(loaded["graphs"].buckets)}

    report.checks.append(run_check("talker.capture", capture))
    graphs = loaded.get("graphs")
    if graphs is not None:
        for name, check in graph_checks(runner, graphs, model.talker, short=False):
            report.checks.append(run_check(name, check))
        runner.graphs = graphs
    period = 1 / FRAME_RATE_HZ
    steps: dict[str, float] = {}

    def step_time() -> dict[str, Any]:
        for bucket in sorted(engine.config.graph_buckets):
            requests = prefill_rows(runner, model.talker, bucket, 2 + options.timed_steps + 2)
            step_rows(runner, requests)  # warm-up
            steps[str(bucket)] = _median_seconds(
                lambda rows=requests: step_rows(runner, rows), device, options.timed_steps
            )
        return {"path": "graphs" if runner.graphs is not None else "eager", "seconds": steps}

    report.checks.append(run_check("talker.step_time", step_time))
    realtime = [int(b) for b, s in steps.items() if s <= period]
    report.talker = {
        "step_path": step_path(graphs.report.mode if runner.graphs is not None else None),
        "buckets": list(engine.config.graph_buckets),
        "step_seconds": steps,
        "frame_period_seconds": period,
        "realtime_streams": max(realtime, default=0),
        "realtime_streams_half_load": max((int(b) for b, s in steps.items() if s <= period / 2), default=0),
        "capture": graphs.report.summary() if graphs is not None else "",
    }
    report.memory["talker_weights_bytes"] = _module_bytes(model.talker)
    report.talker["kv_bytes_per_slot"] = runner.kv_bytes_per_slot
    report.memory["talker_kv_bytes"] = runner.cache.k.numel() * runner.cache.k.element_size() * 2
    report.memory["talker_graph_pool_bytes"] = graphs.report.pool_bytes if graphs is not None else 0
    report.memory["talker_capture_peak_bytes"] = graphs.report.peak_bytes if graphs is not None else 0
    loaded.clear()


# --- decoder -------------------------------------------------------------------------------------
def check_decoder(
    options: DoctorOptions, model_dir: Path, device: torch.device, dtype: torch.dtype, report: DoctorReport
) -> None:
    """Load the decoder, capture and check every bucket, time a chunk per bucket."""
    from decoder_service.config import DEFAULT_GRAPH_MEMORY
    from decoder_service.model.loading import load_codec_decoder
    from decoder_service.model.self_check import graph_checks
    from decoder_service.model.streaming import DecoderSession, SessionBatcher

    loaded: dict[str, Any] = {}
    emulate = device.type != "cuda"
    buckets: dict[str, Any] = {}
    if options.decoder_batch_buckets:
        buckets["batch_buckets"] = options.decoder_batch_buckets
    if options.decoder_frame_buckets:
        buckets["frame_buckets"] = options.decoder_frame_buckets
    bound = DEFAULT_GRAPH_MEMORY if options.decoder_graph_memory is None else options.decoder_graph_memory
    buckets["graph_memory"] = bound or None

    def load() -> dict[str, Any]:
        loaded["decoder"] = load_codec_decoder(model_dir, device, dtype)
        return {}

    report.checks.append(run_check("decoder.load", load))
    if "decoder" not in loaded:
        return
    decoder = loaded["decoder"]

    def capture() -> dict[str, Any]:
        batcher = SessionBatcher(decoder, use_cuda_graphs=not emulate, emulate_cuda_graphs=emulate, **buckets)
        if batcher.graphs is None:
            raise CheckFailedError(f"no batch size fits --graph-memory {format_bytes(bound)}")
        loaded["batcher"] = batcher
        return {
            "mode": "emulated" if emulate else "cuda",
            "buckets": len(batcher.graphs.captured),
            "graph_memory": batcher.graphs.describe_bound(),
        }

    report.checks.append(run_check("decoder.capture", capture))
    batcher = loaded.get("batcher") or SessionBatcher(decoder, use_cuda_graphs=False, **buckets)
    if "batcher" in loaded:
        for name, check in graph_checks(batcher, short=False):
            report.checks.append(run_check(name, check))
    chunk: dict[str, float] = {}
    period = 1 / FRAME_RATE_HZ

    def chunk_time() -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        for b in batcher.batch_buckets:
            for f in batcher.frame_buckets:
                sessions = [DecoderSession(decoder) for _ in range(b)]
                codes = [
                    torch.randint(0, decoder.config.codebook_size, (f, decoder.num_quantizers), generator=gen)
                    for _ in range(b)
                ]
                batcher.advance(sessions, codes)  # warm-up (and a state past the start)
                chunk[f"{b}x{f}"] = _median_seconds(
                    lambda s=sessions, c=codes: batcher.advance(s, c), device, 2
                )
        return {"seconds": chunk}

    report.checks.append(run_check("decoder.chunk_time", chunk_time))
    realtime = {
        key: int(key.split("x")[0]) for key, s in chunk.items() if s <= int(key.split("x")[1]) * period
    }
    graphs = batcher.graphs
    report.decoder = {
        "step_path": step_path(None if graphs is None else graphs.report.mode),
        "batch_buckets": list(batcher.batch_buckets),
        "frame_buckets": list(batcher.frame_buckets),
        "chunk_seconds": chunk,
        "realtime_streams": max(realtime.values(), default=0),
        "capture": graphs.report.summary() if graphs is not None else "",
        "graph_memory": {
            "bound_bytes": bound,
            "held_bytes": graphs.held_bytes if graphs is not None else 0,
            "captured_batch_buckets": list(graphs.batch_buckets) if graphs is not None else [],
            "left_out_batch_buckets": list(graphs.left_out) if graphs is not None else [],
            "summary": graphs.describe_bound() if graphs is not None else "",
        },
    }
    report.memory["decoder_weights_bytes"] = _module_bytes(decoder)
    report.memory["decoder_graph_pool_bytes"] = graphs.report.pool_bytes if graphs is not None else 0
    report.memory["decoder_static_bytes"] = graphs.static_bytes if graphs is not None else 0
    report.memory["decoder_capture_peak_bytes"] = graphs.report.peak_bytes if graphs is not None else 0
    loaded.clear()


# --- the command ---------------------------------------------------------------------------------
def run_doctor(options: DoctorOptions) -> DoctorReport:
    """Every check of the module docstring, into a report."""
    device = torch.device(options.device)
    report = DoctorReport(device=str(device))
    report.environment = environment(device)
    report.checks += environment_checks(device, report.environment)
    if not report.passed:
        return report
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="qwen3-tts-doctor-") as tmp:
        model_dir = options.model
        if model_dir is None:
            from .dev_model import make_dev_model

            size = options.size or ("1b7" if device.type == "cuda" else "dev")
            model_dir = make_dev_model(Path(tmp) / f"dev-{size}", size=size)
            report.environment["model"] = f"dev checkpoint ({size})"
        else:
            report.environment["model"] = str(model_dir)
        # --dtype auto resolves per stage as the stages resolve it (measured on CPU).
        from decoder_service.model.dtype_probe import checkpoint_decoder_probe
        from talker_service.engine import EngineConfig
        from talker_service.engine.dtype_probe import checkpoint_talker_probe

        name = options.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        engine = EngineConfig(max_slots=_talker_slots(options, device), max_seq_len=options.max_seq_len)
        talker_probe = functools.partial(checkpoint_talker_probe, model_dir, engine)
        talker_dtype = resolve_dtype(name, device, talker_probe)
        decoder_dtype = resolve_dtype(name, device, functools.partial(checkpoint_decoder_probe, model_dir))
        report.environment["talker_dtype"] = talker_dtype
        report.environment["decoder_dtype"] = decoder_dtype
        with torch.inference_mode():
            check_talker(options, Path(model_dir), device, getattr(torch, talker_dtype), report)
            check_decoder(options, Path(model_dir), device, getattr(torch, decoder_dtype), report)
    if device.type == "cuda":
        report.memory["peak_bytes"] = torch.cuda.max_memory_allocated(device)
    else:
        report.memory["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report.plan = memory_plan(report)
    return report


def memory_plan(report: DoctorReport) -> MemoryPlan | None:
    """The device's plan from the measured figures: the decoder's share (weights, graph pool,
    capture peak, a CUDA context), the talker's fixed share, and the KV budget left."""
    mem, env = report.memory, report.environment
    if "talker_weights_bytes" not in mem or "kv_bytes_per_slot" not in report.talker:
        return None
    context = CUDA_CONTEXT_BYTES if report.device.startswith("cuda") else 0
    shares = [
        StageShare(
            "talker (fixed)",
            mem["talker_weights_bytes"] + mem["talker_capture_peak_bytes"] + context,
            {
                "weights": mem["talker_weights_bytes"],
                "graphs": mem["talker_capture_peak_bytes"],
                "context": context,
            },
        )
    ]
    if "decoder_weights_bytes" in mem:
        decoder = {
            "weights": mem["decoder_weights_bytes"],
            "graphs": max(mem["decoder_graph_pool_bytes"], mem["decoder_capture_peak_bytes"]),
            "static inputs": mem["decoder_static_bytes"],
            "context": context,
        }
        shares.append(StageShare("decoder", sum(decoder.values()), decoder))
    total = env.get("device_memory") or env.get("device_free") or 0
    return plan_device(report.device, int(total), shares, report.talker["kv_bytes_per_slot"])


def render(report: DoctorReport) -> str:
    """The report for a terminal."""
    env = report.environment
    lines = [
        f"device {report.device}: {env.get('device_name', '')}; torch {env['torch']}, CUDA {env['cuda'] or '-'}, "
        f"driver {env['driver'] or '-'}, triton {env['triton'] or '-'}, cc {env['c_compiler'] or '-'}",
        f"model: {env.get('model', '-')}",
        "",
    ]
    for c in report.checks:
        status = "PASS" if c.passed else "FAIL"
        lines.append(f"{status}  {c.name:<24} {c.seconds:7.2f} s  {c.reason}")
    if report.talker:
        t = report.talker
        per = ", ".join(f"B={b}: {s * 1000:.1f} ms" for b, s in t["step_seconds"].items())
        lines += [
            "",
            f"talker ({t['step_path']}): step {per}",
            f"  streams at real time: {t['realtime_streams']} (half load: {t['realtime_streams_half_load']})",
        ]
    if report.decoder:
        d = report.decoder
        lines.append(
            f"decoder ({d['step_path']}): streams at real time: {d['realtime_streams']} ({len(d['chunk_seconds'])} buckets timed)"
        )
        if d["graph_memory"]["summary"]:
            lines.append(f"  graphs: {d['graph_memory']['summary']}")
    if report.memory:
        lines += [
            "",
            "memory: "
            + ", ".join(
                f"{k.removesuffix('_bytes')} {format_bytes(v)}"
                for k, v in report.memory.items()
                if isinstance(v, int)
            ),
        ]
    if report.plan is not None:
        lines += ["", *report.plan.describe()]
    lines += [
        "",
        "doctor: all checks passed"
        if report.passed
        else f"doctor: FAILED: {', '.join(c.name for c in report.checks if not c.passed)}",
    ]
    return "\n".join(lines)


def write_json(report: DoctorReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")


__all__ = ["DoctorOptions", "DoctorReport", "render", "run_doctor", "write_json"]
