"""Docker Compose files resolved as Docker Compose resolves them (interpolation, override merge),
and the process flags of each service parsed with the servers' own flag code. Used by the deploy
unit tests and tests/integration/test_compose_local.py."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.util
import io
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tts_common.serving.config import ProcessFlags, ServerConfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
CPU_OVERRIDE = DEPLOY / "docker-compose.cpu.yml"

STAGE_MODULES = {
    "talker_service": "talker",
    "decoder_service": "decoder",
    "speaker_service": "speaker",
    "aligner_service": "aligner",
    "gateway": "gateway",
}
"""``python -m MODULE`` → the stage name of the process (its ``FLAGS.stage``)."""
DEFAULT_PORTS = {"gateway": 50051, "talker": 50052, "decoder": 50053, "speaker": 50054, "aligner": 50055}
"""The processes' built-in default ports (their ``DEFAULT_PORT``)."""
MODEL_STAGES = ("talker", "decoder", "speaker")
"""The stages that load the TTS checkpoint (and that every gateway targets)."""
ALIGNER_STAGE = "aligner"
"""The optional word-timing stage: it loads its own checkpoint (a Qwen3-ForcedAligner)."""
MODEL_PATH = "/models/checkpoint"
ALIGNER_MODEL_PATH = "/models/aligner"
VOICES_PATH = "/var/lib/qwen3tts/voices"
COMPILE_CACHE_PATH = "/var/cache/qwen3tts"
"""Where the image's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR live: a volume in the talker."""
PROCESS_FLAGS = {
    "talker": "talker_service.config",
    "decoder": "decoder_service.config",
    "speaker": "speaker_service.config",
    "aligner": "aligner_service.config",
    "gateway": "gateway.config",
}
"""The module defining each process's command line (its ``FLAGS``, a
:class:`tts_common.serving.config.ProcessFlags`), which its ``__main__`` parses."""


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
ComposeLoader.add_constructor("!override", lambda loader, node: Override(_construct_plain(loader, node)))


def load_yaml(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=ComposeLoader)
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
        raise InterpolationError(f"required variable {name} is missing a value: {interpolate(operand, env)}")
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
        return {
            "host_ip": spec.get("host_ip", ""),
            "published": str(spec.get("published", "")),
            "target": int(spec["target"]),
            "protocol": spec.get("protocol", "tcp"),
        }
    text, _, protocol = str(spec).partition("/")
    parts = text.rsplit(":", 2) if text.count(":") <= 2 else None
    if parts is None:
        raise ValueError(f"unsupported port syntax {spec!r}")
    target = int(parts[-1])
    published = parts[-2] if len(parts) >= 2 else ""
    host_ip = parts[-3] if len(parts) == 3 else ""
    return {"host_ip": host_ip, "published": published, "target": target, "protocol": protocol or "tcp"}


def _parse_volume(spec: Any, base_dir: Path) -> dict[str, Any]:
    """Short volume syntax ``SOURCE:TARGET[:MODE]``: a source that looks like a path (``/``,
    ``.``, ``~``) is a bind mount resolved against the compose file's directory, anything else a
    named volume."""
    if isinstance(spec, dict):
        return {
            "type": spec["type"],
            "source": spec.get("source", ""),
            "target": spec["target"],
            "read_only": bool(spec.get("read_only", False)),
        }
    parts = str(spec).split(":")
    if len(parts) == 1:
        return {"type": "volume", "source": "", "target": parts[0], "read_only": False}
    source, target = parts[0], parts[1]
    mode = parts[2].split(",") if len(parts) > 2 else []
    if source.startswith(("/", ".", "~")):
        kind = "bind"
        source = (
            os.path.normpath(base_dir / os.path.expanduser(source))
            if not source.startswith("/")
            else os.path.normpath(source)
        )
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
        svc["networks"] = dict.fromkeys(svc["networks"])
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
        data["services"] = {
            name: _normalize_service(svc or {}, path.parent) for name, svc in services.items()
        }
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


def process_flags(stage: str) -> ProcessFlags:
    """The real command line of the process of ``stage``."""
    flags = importlib.import_module(PROCESS_FLAGS[stage]).FLAGS
    assert flags.stage == stage and flags.default_port == DEFAULT_PORTS[stage], flags
    return flags


def server_config(stage: str, argv: list[str], env: Mapping[str, str]) -> ServerConfig:
    """The ServerConfig the process of ``stage`` will use for ``argv`` (its arguments after the
    module) and environment ``env``, parsed by the process's own parser (flags it does not know
    are ignored here; :func:`process_args` rejects them)."""
    flags = process_flags(stage)
    namespace, _unknown = flags.parser(env, add_help=False).parse_known_args(argv)
    return flags.server_config(namespace)


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
    test with argparse's message."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return process_flags(stage).parser(env).parse_args(argv)
        except SystemExit:
            pytest.fail(f"{stage} rejects {argv}: {stderr.getvalue()}")


def service_process(service: dict[str, Any]) -> tuple[str, ServerConfig] | None:
    """(stage, ServerConfig) of a service that runs one of the four processes, else None."""
    module = process_module(service.get("command") or [])
    if module not in STAGE_MODULES:
        return None
    stage = STAGE_MODULES[module]
    env = {k: v for k, v in (service.get("environment") or {}).items() if v is not None}
    return stage, server_config(stage, service["command"][3:], env)


def http_port(service: dict[str, Any]) -> int:
    """The HTTP API port of a service running the gateway (0: off), from its command line and
    environment parsed by the gateway's own parser."""
    process = service_process(service)
    assert process is not None and process[0] == "gateway", "not a gateway service"
    env = {k: v for k, v in (service.get("environment") or {}).items() if v is not None}
    return int(process_args("gateway", service["command"][3:], env).http_port)


# ---------------------------------------------------------------------------------------------
# Fixtures

VARIANTS = {
    "gpu": (COMPOSE_FILE,),
    "cpu": (COMPOSE_FILE, CPU_OVERRIDE),
}


def processes(model: dict[str, Any]) -> dict[str, tuple[str, ServerConfig]]:
    """service name → (stage, ServerConfig) for the long-running server services."""
    result = {}
    for name, service in model["services"].items():
        proc = service_process(service)
        if proc is not None:
            result[name] = proc
    return result
