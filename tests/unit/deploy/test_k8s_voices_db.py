"""deploy/k8s/postgres/: the voice library's PostgreSQL for Kubernetes (the gateway's Secret with
the database URL, and the optional single-instance server for trials): valid objects (strict
schema validation, as test_k8s), consistent with each other and with the gateway pods, a URL the
voice library itself accepts, and a Secret the gateway Deployment reads into settings its own
parser accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import gateway_config_from_args
from gateway.core.library import library_target
from gateway.voice_library import PostgresVoiceLibrary, create_voice_library
from tests.helpers import compose
from tests.unit.deploy.test_k8s import (
    MIN_K8S,
    NAMESPACE,
    VOICES_DB_SECRET,
    container_env,
    deployment_stage,
    labels_match,
    load_docs,
    objects_of,
)

POSTGRES_DIR = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "postgres"


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [
        doc
        for path in sorted(POSTGRES_DIR.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_docs(path)
    ]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


@pytest.mark.parametrize("version", [MIN_K8S, "latest"])
def test_manifests_validate_against_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (bundled API schemas) not installed"
    )
    from kubernetes_validate.utils import latest_version

    target = latest_version() if version == "latest" else version
    for (kind, name), doc in objects().items():
        try:
            kubernetes_validate.validate(doc, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kind}/{name}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_kustomization_lists_every_manifest_in_the_namespace() -> None:
    kustomization = yaml.safe_load((POSTGRES_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in POSTGRES_DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert {doc["metadata"]["namespace"] for doc in objects().values()} == {NAMESPACE}


def test_the_gateway_secret_points_at_the_trial_server() -> None:
    found = objects()
    url = found[("Secret", "qwen3-tts-voices-db")]["stringData"]["QWEN3TTS_GATEWAY_VOICES_DB"]
    assert isinstance(create_voice_library(url), PostgresVoiceLibrary)
    server = found[("Secret", "voices-postgres")]["stringData"]
    service = found[("Service", "voices-postgres")]
    parts = urlsplit(url)
    assert (parts.hostname, parts.port) == (service["metadata"]["name"], service["spec"]["ports"][0]["port"])
    assert (parts.username, parts.password, parts.path) == (
        server["POSTGRES_USER"],
        server["POSTGRES_PASSWORD"],
        f"/{server['POSTGRES_DB']}",
    )


def test_server_service_and_policy_select_the_database_pod_and_admit_the_gateway() -> None:
    found = objects()
    statefulset = found[("StatefulSet", "voices-postgres")]
    pod = statefulset["spec"]["template"]
    assert labels_match(statefulset["spec"]["selector"], pod["metadata"]["labels"])
    assert labels_match(
        {"matchLabels": found[("Service", "voices-postgres")]["spec"]["selector"]}, pod["metadata"]["labels"]
    )
    (container,) = pod["spec"]["containers"]
    assert {p["name"] for p in container["ports"]} == {"postgres"}
    assert container["envFrom"] == [{"secretRef": {"name": "voices-postgres"}}]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # no ReadWriteMany needed
    policy = found[("NetworkPolicy", "voices-postgres-from-gateway-only")]["spec"]
    assert labels_match(policy["podSelector"], pod["metadata"]["labels"])
    gateway_pod = objects_of("Deployment")["gateway"]["spec"]["template"]["metadata"]["labels"]
    (rule,) = policy["ingress"]
    assert labels_match(rule["from"][0]["podSelector"], gateway_pod)
    assert rule["ports"] == [{"port": "postgres", "protocol": "TCP"}]


def test_the_gateway_reads_the_secret_into_its_voice_library_settings() -> None:
    """The gateway Deployment (and so the multi-model overlay, which keeps it) takes the Secret's
    variables as its voice library's URL and owner secret, through its real flag parser."""
    secret = {k: str(v) for k, v in objects()[("Secret", VOICES_DB_SECRET)]["stringData"].items()}
    assert set(secret) == {"QWEN3TTS_GATEWAY_VOICES_DB", "QWEN3TTS_GATEWAY_VOICES_OWNER_SECRET"}
    deployment = objects_of("Deployment")["gateway"]
    _, argv = deployment_stage(deployment)
    env = container_env(deployment["spec"]["template"]["spec"], secrets={VOICES_DB_SECRET: secret})
    config = gateway_config_from_args(compose.process_args("gateway", argv, env))
    assert library_target(config) == secret["QWEN3TTS_GATEWAY_VOICES_DB"]
    assert config.voice_library().owner_secret == secret["QWEN3TTS_GATEWAY_VOICES_OWNER_SECRET"].encode()
