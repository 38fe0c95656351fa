"""deploy/docker-compose.models.yml (+ .models.cpu.yml): several models behind one gateway, resolved
as Docker Compose resolves them: a talker per added model and the Base model's speaker stage,
each on its own checkpoint, the stack's one decoder pool, and a gateway whose ``--models`` points
at every model's services (parsed with the gateway's own flags)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ModelRoute
from tests.helpers.compose import (
    COMPILE_CACHE_PATH,
    COMPOSE_FILE,
    CPU_OVERRIDE,
    DEPLOY,
    MODEL_PATH,
    _strip_tags,
    interpolate_tree,
    load_compose,
    load_yaml,
    process_args,
    process_module,
)
from tests.unit.deploy.test_compose import _comparable, _real_compose_config

MODELS_OVERRIDE = DEPLOY / "docker-compose.models.yml"
MODELS_CPU_OVERRIDE = DEPLOY / "docker-compose.models.cpu.yml"
VARIANTS = {
    "gpu": (COMPOSE_FILE, MODELS_OVERRIDE),
    "cpu": (COMPOSE_FILE, CPU_OVERRIDE, MODELS_OVERRIDE, MODELS_CPU_OVERRIDE),
}
ADDED = ("talker-design", "talker-base", "speaker-base")


def _args(service: dict[str, Any]) -> Any:
    command = [str(c) for c in service["command"]]
    stage = {"talker_service": "talker", "speaker_service": "speaker", "gateway": "gateway"}[
        str(process_module(command))
    ]
    return process_args(
        stage, command[3:], {k: str(v) for k, v in (service.get("environment") or {}).items()}
    )


def _devices(service: dict[str, Any]) -> list[Any]:
    return (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_model_has_its_stages_and_the_gateway_names_them(name: str) -> None:
    model = load_compose(VARIANTS[name], {})
    services = model["services"]
    assert set(ADDED) | {"talker", "decoder", "speaker", "gateway"} <= set(services)
    gateway = _args(services["gateway"])
    assert gateway.models == (
        ModelRoute("custom_voice", ("dns:///talker:50052",), ("dns:///speaker:50054",)),
        ModelRoute("voice_design", ("dns:///talker-design:50052",)),
        ModelRoute("base", ("dns:///talker-base:50052",), ("dns:///speaker-base:50054",)),
    )
    assert gateway.decoder_targets == ("dns:///decoder:50053",) and not gateway.talker_targets
    for route in gateway.models:  # every target is its service's port
        for target in (*route.talker_targets, *route.speaker_targets):
            service, port = target.removeprefix("dns:///").split(":")
            assert _args(services[service]).port == int(port), target
    sources = {}
    for added in ADDED:
        service = services[added]
        (volume,) = [v for v in service["volumes"] if v["target"] == MODEL_PATH]
        assert volume.get("read_only")
        sources[added] = volume["source"]
        assert (
            not service.get("ports")
            and service["networks"] == {"internal": None}
            or "internal" in service["networks"]
        )
        assert _args(service).port == int(service["healthcheck"]["test"][-1].split(":")[1])
        init = next(iter(service["depends_on"]))
        assert services[init]["volumes"][0]["source"] == volume["source"]
        gpu = bool(_devices(service))
        assert gpu == (name == "gpu"), added
        assert _args(service).device == ("cuda" if name == "gpu" else "cpu")
    assert sources["talker-base"] == sources["speaker-base"] != sources["talker-design"]
    assert services["model-init-design"]["environment"]["QWEN3TTS_DEV_MODEL_TYPE"] == "voice_design"
    assert services["model-init-base"]["environment"]["QWEN3TTS_DEV_MODEL_TYPE"] == "base"
    assert set(services["gateway"]["depends_on"]) >= {"talker", "decoder", *ADDED}


def test_model_names_and_directories_come_from_the_environment() -> None:
    env = {
        "QWEN3TTS_BASE_MODEL_DIR": "/srv/base",
        "QWEN3TTS_BASE_MODEL_NAME": "clone-1b7",
        "QWEN3TTS_MODEL_NAME": "cv",
    }
    services = load_compose(VARIANTS["gpu"], env)["services"]
    routes = _args(services["gateway"]).models
    assert [r.name for r in routes] == ["cv", "voice_design", "clone-1b7"]
    assert services["talker-base"]["volumes"][0]["source"] == "/srv/base"


@pytest.mark.parametrize(
    "env", [{}, {"QWEN3TTS_DESIGN_MODEL_DIR": "/srv/design", "QWEN3TTS_MODEL_NAME": "cv"}]
)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_resolution_matches_docker_compose(name: str, env: dict[str, str]) -> None:
    resolved = {
        "real": _real_compose_config(VARIANTS[name], env)["services"],
        "ours": load_compose(VARIANTS[name], env)["services"],
    }
    real, ours = ({k: _comparable(v) for k, v in services.items()} for services in resolved.values())
    assert ours == real


def test_files_validate_against_the_compose_schema() -> None:
    import importlib.util

    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.origin:
        pytest.skip("check-jsonschema (vendored Compose schema) not installed")
    import jsonschema

    schema = json.loads(
        (Path(spec.origin).parent / "builtin_schemas" / "vendor" / "compose-spec.json").read_text(
            encoding="utf-8"
        )
    )
    for path in (MODELS_OVERRIDE, MODELS_CPU_OVERRIDE):
        data = _strip_tags(interpolate_tree(load_yaml(path), {}))
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(data), key=str)
        assert not errors, f"{path.name}: " + "; ".join(e.message for e in errors)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_talker_keeps_its_compile_cache_on_the_volume(name: str) -> None:
    """The added models' talkers compile on CUDA like the stack's: the same writable named
    volume at COMPILE_CACHE_PATH (the image's TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR)."""
    model = load_compose(VARIANTS[name], {})
    talkers = [
        s
        for s, svc in model["services"].items()
        if process_module(svc.get("command") or []) == "talker_service"
    ]
    assert len(talkers) == 3
    for service in talkers:
        mounts = {v["target"]: v for v in model["services"][service]["volumes"]}
        cache = mounts[COMPILE_CACHE_PATH]
        assert (
            cache["type"] == "volume" and cache["source"] in model["volumes"] and not cache.get("read_only")
        )
