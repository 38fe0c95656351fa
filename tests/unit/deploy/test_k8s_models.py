"""deploy/k8s-models: the multi-model overlay of deploy/k8s, built with ``kubectl kustomize``: a
talker Deployment and headless Service per added model, the Base model's speaker stage, each on
its own checkpoint of the models volume, and a gateway whose ``--models`` (from the ConfigMap)
points at every model's Services (parsed with the gateway's own flags)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import FLAGS, gateway_config_from_args
from tests.helpers import compose
from tests.helpers.tools import find_tool
from tests.unit.deploy.test_k8s import MIN_K8S, STAGE_MODULES, labels_match

OVERLAY = Path(__file__).resolve().parents[3] / "deploy" / "k8s-models"
ADDED = ("talker-voice-design", "talker-base", "speaker-base")

pytestmark = pytest.mark.skipif(find_tool("kubectl") is None, reason="kubectl (kustomize) not installed")


@cache
def built() -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [str(find_tool("kubectl")), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0 and "unknown command" in result.stderr:
        pytest.skip("this kubectl has no kustomize")
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def of(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in built() if d["kind"] == kind}


def pod_env(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (config,) = of("ConfigMap").values()
    env = {k: str(v) for k, v in config["data"].items()}
    env.update({e["name"]: str(e["value"]) for e in container.get("env") or []})
    return env


def process(deployment: dict[str, Any]) -> tuple[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    stage = STAGE_MODULES[args[2]]
    return stage, compose.process_args(stage, args[3:], pod_env(deployment))


def test_every_model_has_its_stages_and_the_gateway_names_them() -> None:
    deployments, services = of("Deployment"), of("Service")
    assert set(ADDED) <= set(deployments)
    (config,) = of("ConfigMap").values()
    assert (
        "QWEN3TTS_TALKER_TARGETS" not in config["data"] and "QWEN3TTS_SPEAKER_TARGETS" not in config["data"]
    )
    gateway = deployments["gateway"]
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    flags = FLAGS.parser(pod_env(gateway))
    settings = gateway_config_from_args(flags.parse_args(container["args"][3:]))
    assert [m.name for m in settings.models] == ["custom_voice", "voice_design", "base"]
    checkpoints = {}
    for route in settings.models:
        for target in (*route.talker_targets, *route.speaker_targets):
            match = re.fullmatch(r"dns:///([a-z0-9-]+)\.qwen3-tts\.svc\.cluster\.local:(\d+)", target)
            assert match, target
            name, port = match.group(1), int(match.group(2))
            service = services[name]["spec"]
            assert service.get("clusterIP") == "None" and port in {p["port"] for p in service["ports"]}
            assert process(deployments[name])[1].port == port
            checkpoints[name] = pod_env(deployments[name])["QWEN3TTS_MODEL"]
    assert checkpoints == {
        "talker": "/models/checkpoint",
        "speaker": "/models/checkpoint",
        "talker-voice-design": "/models/voice-design",
        "talker-base": "/models/base",
        "speaker-base": "/models/base",
    }
    assert [route.speaker_targets != () for route in settings.models] == [True, False, True]


def test_services_budgets_and_policies_select_their_own_pods() -> None:
    labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in of("Deployment").items()}
    for name, service in of("Service").items():
        selected = [
            n for n, pod in labels.items() if labels_match({"matchLabels": service["spec"]["selector"]}, pod)
        ]
        assert selected == [name], f"Service {name} selects {selected}"
    for name, budget in of("PodDisruptionBudget").items():
        assert [n for n, pod in labels.items() if labels_match(budget["spec"]["selector"], pod)] == [name]
    stages = of("NetworkPolicy")["stages-from-gateway-only"]["spec"]["podSelector"]
    assert {n for n, pod in labels.items() if labels_match(stages, pod)} == set(labels) - {"gateway"}
    for name in ADDED:
        pod = of("Deployment")[name]["spec"]["template"]["spec"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models"]
        assert (
            mount["readOnly"]
            and pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "qwen3-tts-models"
        )


@pytest.mark.parametrize("version", [MIN_K8S, "latest"])
def test_the_overlay_validates_against_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import latest_version

    target = latest_version() if version == "latest" else version
    for doc in (
        *built(),
        *yaml.safe_load_all((OVERLAY / "fetch-models-job.yaml").read_text(encoding="utf-8")),
    ):
        kubernetes_validate.validate(doc, target, strict=True)


def test_every_talker_keeps_its_compile_cache_on_the_pvc() -> None:
    """The added talkers mount the compile-cache PVC at COMPILE_CACHE_PATH like the base's
    talker (deploy/k8s/compile-cache-pvc.yaml), not only the emptyDir /tmp."""
    claims = of("PersistentVolumeClaim")
    talkers = [d for d in of("Deployment").values() if process(d)[0] == "talker"]
    assert len(talkers) == 3
    for deployment in talkers:
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        claim = volumes[mounts[compose.COMPILE_CACHE_PATH]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim in claims and not mounts[compose.COMPILE_CACHE_PATH].get("readOnly")
