"""deploy/k8s/*.yaml: valid Kubernetes objects that fit the processes they run.

Schema: every object is validated against the Kubernetes OpenAPI-derived JSON schemas bundled by
the ``kubernetes-validate`` package (strict: unknown fields are errors), for the oldest version
the manifests support (1.27: native gRPC probes are GA) and the newest bundled one. Skipped with
a reason where the package is not installed; the structural checks below run regardless.

Consistency: each container's gRPC/metrics ports and grace period are computed from its ``args``
plus the ConfigMap/``env`` variables by the servers' own flag code
(each process's ``FLAGS``, :class:`tts_common.serving.config.ProcessFlags`), then compared with containerPorts, probes,
Services, Prometheus annotations, the gateway's ``dns:///`` targets and terminationGracePeriod.
Probe service names are the fully-qualified names from the generated protobuf descriptors.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from tests.helpers import compose
from tests.helpers.tools import find_tool
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.serving.config import ServerConfig
from tts_common.serving.names import service_name

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "deploy" / "k8s"
NAMESPACE = "qwen3-tts"

STAGE_MODULES = {
    "talker_service": "talker",
    "decoder_service": "decoder",
    "speaker_service": "speaker",
    "aligner_service": "aligner",
    "gateway": "gateway",
}
DEFAULT_PORTS = {"gateway": 50051, "talker": 50052, "decoder": 50053, "speaker": 50054, "aligner": 50055}
MODEL_STAGES = ("talker", "decoder", "speaker")
"""The stages that load the TTS checkpoint (QWEN3TTS_MODEL) and that the gateway targets."""
ALIGNER = "aligner"
"""The optional word-timing stage, on a GPU like the others, with its own checkpoint
(QWEN3TTS_ALIGNER_MODEL, in the same models volume)."""
GPU_STAGES = (*MODEL_STAGES, ALIGNER)
HEALTH_SERVICES = {
    "gateway": service_name(tts_pb2, "TextToSpeech"),
    "talker": service_name(stages_pb2, "Talker"),
    "decoder": service_name(stages_pb2, "Decoder"),
    "speaker": service_name(stages_pb2, "Speaker"),
    "aligner": service_name(stages_pb2, "Aligner"),
}
VOICES_DB_SECRET = "qwen3-tts-voices-db"
"""The Secret the gateway reads the voice library's URL and owner secret from (optional: it is
deploy/k8s/postgres/voices-db-secret.yaml's, applied beside this stack)."""
OPTIONAL_MANIFESTS = {"fetch-model-job.yaml"}
"""Applied by hand once (documented), deliberately not in kustomization.yaml."""
MIN_K8S = "1.27"


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load_docs(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def all_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in manifest_files() for doc in load_docs(path)]


def objects_of(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in all_objects() if doc["kind"] == kind}


def configmap_env() -> dict[str, str]:
    (config,) = objects_of("ConfigMap").values()
    return {k: str(v) for k, v in config["data"].items()}


def container_env(
    pod_spec: dict[str, Any], secrets: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """The environment the (single) container sees from envFrom ConfigMaps (and ``secrets``, by
    name: an optional Secret that is not given is absent) and env values."""
    (container,) = pod_spec["containers"]
    maps = objects_of("ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            name = source["secretRef"]["name"]
            assert source["secretRef"].get("optional") or name in (secrets or {}), f"missing Secret {name}"
            env.update((secrets or {}).get(name, {}))
            continue
        name = source["configMapRef"]["name"]
        assert name in maps, f"envFrom references missing ConfigMap {name}"
        env.update({k: str(v) for k, v in maps[name]["data"].items()})
    for item in container.get("env") or []:
        env[item["name"]] = str(item["value"])
    return env


def server_config(stage: str, argv: list[str], env: dict[str, str]) -> ServerConfig:
    """The ServerConfig the stage process derives from ``argv`` and ``env`` (its real parser)."""
    return compose.server_config(stage, argv, env)


def deployment_stage(deployment: dict[str, Any]) -> tuple[str, list[str]]:
    """(stage, argv after the module) of a Deployment's container."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "command" not in container, "use args: command would bypass the image entrypoint"
    args = container["args"]
    assert args[:2] == ["python", "-m"], args
    return STAGE_MODULES[args[2]], args[3:]


def stage_deployments() -> Iterator[tuple[str, dict[str, Any], ServerConfig]]:
    for deployment in objects_of("Deployment").values():
        stage, argv = deployment_stage(deployment)
        pod = deployment["spec"]["template"]["spec"]
        yield stage, deployment, server_config(stage, argv, container_env(pod))


def labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels + matchExpressions In/NotIn/Exists) selects labels."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_labels() -> dict[str, dict[str, str]]:
    return {name: d["spec"]["template"]["metadata"]["labels"] for name, d in objects_of("Deployment").items()}


def container_ports(deployment: dict[str, Any]) -> dict[str, int]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def gateway_http_port(deployment: dict[str, Any]) -> int:
    """The gateway container's HTTP API port, from its args and environment (the real parser)."""
    stage, argv = deployment_stage(deployment)
    assert stage == "gateway"
    pod = deployment["spec"]["template"]["spec"]
    return int(compose.process_args("gateway", argv, container_env(pod)).http_port)


# ---------------------------------------------------------------------------------------------
# Schema validation


@pytest.mark.parametrize("version", [MIN_K8S, "latest"])
def test_manifests_validate_against_kubernetes_schemas(version: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (bundled API schemas) not installed"
    )
    from kubernetes_validate.utils import latest_version

    target = latest_version() if version == "latest" else version
    failures = []
    for path, doc in all_objects():
        try:
            kubernetes_validate.validate(doc, target, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(
                f"{path.name} {doc['kind']}/{doc['metadata']['name']}: "
                f"{'.'.join(map(str, exc.path))}: {exc.message}"
            )
    assert not failures, "\n".join(failures)


def test_schema_validation_rejects_a_misspelt_field() -> None:
    """The validator is strict (guards the test above against silently accepting anything)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = dict(objects_of("Deployment")["talker"])
    broken = yaml.safe_load(yaml.safe_dump(deployment).replace("readinessProbe", "readinesProbe"))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, MIN_K8S, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    for name in listed:
        assert (K8S / name).is_file(), f"kustomization lists missing {name}"
    assert set(listed) | OPTIONAL_MANIFESTS == {p.name for p in manifest_files()}


@pytest.mark.skipif(find_tool("kubectl") is None, reason="kubectl not installed")
def test_kustomize_build() -> None:
    result = subprocess.run(
        [str(find_tool("kubectl")), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0 and "unknown command" in result.stderr:
        pytest.skip("this kubectl has no kustomize")
    assert result.returncode == 0, result.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(result.stdout) if d}
    listed = {
        (d["kind"], d["metadata"]["name"]) for p, d in all_objects() if p.name not in OPTIONAL_MANIFESTS
    }
    assert built == listed


# ---------------------------------------------------------------------------------------------
# Structure


def test_everything_in_one_namespace() -> None:
    namespaces = objects_of("Namespace")
    assert set(namespaces) == {NAMESPACE}
    for path, doc in all_objects():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{path.name} {doc['kind']}"


def test_one_deployment_per_stage() -> None:
    stages = sorted(stage for stage, _, _ in stage_deployments())
    assert stages == sorted(DEFAULT_PORTS)
    for stage, deployment, _ in stage_deployments():
        assert deployment["metadata"]["name"] == stage
        selector = deployment["spec"]["selector"]
        assert labels_match(selector, deployment["spec"]["template"]["metadata"]["labels"])
        # The selector picks this Deployment's pods only.
        others = [n for n, labels in pod_labels().items() if labels_match(selector, labels)]
        assert others == [stage]


def test_modules_are_packages_of_the_project() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for deployment in objects_of("Deployment").values():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        module = container["args"][2]
        assert any(re.fullmatch(p.replace("*", ".*"), module) for p in included), module


def test_ports_probes_and_annotations_follow_the_process_flags() -> None:
    for stage, deployment, config in stage_deployments():
        # Probes and other pods connect to the pod IP: a loopback bind would be unreachable.
        assert config.host not in ("127.0.0.1", "localhost", "::1", "[::1]"), (stage, config.host)
        ports = container_ports(deployment)
        assert ports["grpc"] == config.port, stage
        assert ports["metrics"] == config.metrics_port, stage
        assert config.metrics_port > 0, f"{stage}: metrics disabled"
        template = deployment["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(config.metrics_port)
        assert annotations["prometheus.io/path"] == "/metrics"
        (container,) = template["spec"]["containers"]
        http = gateway_http_port(deployment) if stage == "gateway" else 0
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[probe_name]
            handlers = {"grpc", "httpGet", "tcpSocket", "exec"} & set(probe)
            if stage == "gateway" and probe_name == "readinessProbe":
                # The HTTP API's /health: the shared health, through the HTTP listener.
                assert handlers == {"httpGet"}, "gateway readiness: HTTP probe of /health expected"
                assert probe["httpGet"]["path"] == "/health"
                assert ports[probe["httpGet"]["port"]] == http > 0
                continue
            assert handlers == {"grpc"}, f"{stage} {probe_name}: native gRPC probe expected"
            assert probe["grpc"]["port"] == config.port, f"{stage} {probe_name}"
        # Readiness asks for the stage's own service; liveness/startup the overall status.
        if stage != "gateway":
            assert container["readinessProbe"]["grpc"]["service"] == HEALTH_SERVICES[stage]
        assert container["livenessProbe"]["grpc"].get("service", "") == ""
        assert container["startupProbe"]["grpc"].get("service", "") == ""


def _window(probe: dict[str, Any]) -> int:
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def test_args_parse_with_the_real_process_flags() -> None:
    """Container args + ConfigMap/env are accepted by each process's own parser and give the
    intended model, device, dtype and stage targets."""
    for stage, deployment, _ in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        _, argv = deployment_stage(deployment)
        args = compose.process_args(stage, argv, container_env(pod))
        if stage in MODEL_STAGES:
            assert args.model == configmap_env()["QWEN3TTS_MODEL"]
            assert args.device == "cuda"
        elif stage == ALIGNER:
            assert (
                args.model == configmap_env()["QWEN3TTS_ALIGNER_MODEL"] != configmap_env()["QWEN3TTS_MODEL"]
            )
            assert args.device == "cuda" and args.dtype == "float32"
        else:
            from gateway.config import gateway_config_from_args

            config = gateway_config_from_args(args)
            assert config.voices_dir is None and config.voices_db is None  # the Secret's (optional)
            assert all(len(getattr(config, f"{s}_targets")) == 1 for s in MODEL_STAGES)
        if stage == "talker":
            assert args.dtype == "bfloat16" and args.max_slots > 0 and args.max_seq_len >= 1024


def test_probe_timing_and_graceful_termination() -> None:
    for stage, deployment, config in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        grace_period = pod["terminationGracePeriodSeconds"]
        pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        pre_stop_seconds = float(pre_stop[1])
        # preStop runs first, then SIGTERM starts the server's drain of `grace_seconds`.
        assert grace_period >= pre_stop_seconds + config.grace_seconds + 10, stage
        # A liveness failure must never cut a drain short (health is NOT_SERVING meanwhile).
        assert _window(container["livenessProbe"]) >= grace_period, stage
        # Model loading; the gateway's startup waits for the talker's model info.
        assert _window(container["startupProbe"]) >= 600, f"{stage}: model load time"
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[probe_name]
            assert probe.get("timeoutSeconds", 1) < probe.get("periodSeconds", 10) + 1


def test_rolling_updates_never_drop_below_capacity() -> None:
    for stage, deployment, _ in stage_deployments():
        strategy = deployment["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        assert strategy["rollingUpdate"]["maxUnavailable"] == 0, stage
        assert strategy["rollingUpdate"]["maxSurge"] >= 1, stage


def test_gpu_requests() -> None:
    for stage, deployment, _ in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        limits = container["resources"]["limits"]
        env = container_env(pod)
        if stage in GPU_STAGES:
            assert limits.get("nvidia.com/gpu") == 1, stage
            assert env[f"QWEN3TTS_{stage.upper()}_DEVICE"] == "cuda"
            assert any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or [])
        else:
            assert "nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in container["resources"].get(
                "requests", {}
            )
        assert "memory" in limits and "memory" in container["resources"]["requests"]


def test_model_volume_and_configuration() -> None:
    env = configmap_env()
    model_path = env["QWEN3TTS_MODEL"]
    assert env["QWEN3TTS_DEV_MODEL"] == "never", "a cluster must never serve the random model"
    claims = objects_of("PersistentVolumeClaim")
    for stage, deployment, _ in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        assert set(mounts) <= set(volumes), stage
        if stage == ALIGNER:  # its own checkpoint, in the same read-only volume
            model_mounts = [
                m for m in mounts.values() if env["QWEN3TTS_ALIGNER_MODEL"].startswith(m["mountPath"])
            ]
        else:
            model_mounts = [m for m in mounts.values() if model_path.startswith(m["mountPath"])]
        if stage in GPU_STAGES:
            (mount,) = model_mounts
            assert mount["readOnly"], f"{stage}: mount the models read-only"
            assert model_path.startswith(mount["mountPath"].rstrip("/") + "/"), stage
            claim = volumes[mount["name"]]["persistentVolumeClaim"]
            assert claim["claimName"] in claims and claim.get("readOnly"), stage
        else:
            assert not model_mounts, "the gateway loads no model"
            # stateless: voices live in the shared database (no voices volume, no ReadWriteMany)
            assert not [v for v in volumes.values() if "persistentVolumeClaim" in v], "gateway volumes"
            (container,) = pod["containers"]
            assert {"secretRef": {"name": VOICES_DB_SECRET, "optional": True}} in container["envFrom"]
            assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
        # readOnlyRootFilesystem needs a writable /tmp (HOME points there).
        if container["securityContext"].get("readOnlyRootFilesystem"):
            assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]
            assert container_env(pod)["HOME"] == "/tmp"


def test_the_talker_compile_cache_is_persistent() -> None:
    """The talker's torch.compile / Triton cache (the image's TORCHINDUCTOR_CACHE_DIR and
    TRITON_CACHE_DIR live under COMPILE_CACHE_PATH) is a writable PersistentVolumeClaim shared by
    its replicas, not the emptyDir /tmp that every pod start empties (a recompile inside the
    startupProbe's window); the other stages compile nothing and mount nothing there."""
    claims = objects_of("PersistentVolumeClaim")
    for stage, deployment, _ in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        if stage != "talker":
            assert compose.COMPILE_CACHE_PATH not in mounts, stage
            continue
        mount = mounts[compose.COMPILE_CACHE_PATH]
        assert not mount.get("readOnly")
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        assert claim is not None, "an emptyDir is emptied at every pod start"
        assert not claim.get("readOnly")
        assert "ReadWriteMany" in claims[claim["claimName"]]["spec"]["accessModes"], "shared by replicas"
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"], "writable"


def test_pods_run_as_the_image_user() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    (user,) = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile, re.M)
    for stage, deployment, _ in stage_deployments():
        pod = deployment["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True, stage
        assert str(security["runAsUser"]) == user[0], stage
        (container,) = pod["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert pod.get("enableServiceLinks") is False, (
            f"{stage}: Service env vars (TALKER_PORT=tcp://...) must not leak into the env"
        )


def test_services() -> None:
    services = objects_of("Service")
    deployments = objects_of("Deployment")
    labels = pod_labels()
    for stage, _deployment, config in stage_deployments():
        service = services[stage]
        spec = service["spec"]
        selected = [n for n, pod in labels.items() if labels_match({"matchLabels": spec["selector"]}, pod)]
        assert selected == [stage], f"Service {stage} selects {selected}"
        if stage in GPU_STAGES:
            assert spec.get("clusterIP") == "None", f"{stage}: headless for per-pod balancing"
            assert not spec.get("publishNotReadyAddresses"), stage
        else:
            assert spec.get("type", "ClusterIP") == "ClusterIP"
            assert spec.get("clusterIP") != "None"
        ports = {p["name"]: p for p in spec["ports"]}
        named = container_ports(deployments[stage])
        assert ports["grpc"]["port"] == config.port
        if stage == "gateway":  # the HTTP API too, on its own port
            assert named[ports["http"]["targetPort"]] == gateway_http_port(deployments[stage])
            assert ports["http"]["port"] == named["http"]
        for port in ports.values():
            assert port["targetPort"] in named, f"{stage}: unknown targetPort {port['targetPort']}"
        assert named[ports["grpc"]["targetPort"]] == config.port


def test_gateway_targets_resolve_to_headless_services() -> None:
    services = objects_of("Service")
    configs = {stage: config for stage, _, config in stage_deployments()}
    gateway_pod = objects_of("Deployment")["gateway"]["spec"]["template"]["spec"]
    env = container_env(gateway_pod)
    (container,) = gateway_pod["containers"]
    for stage in MODEL_STAGES:
        flag = f"--{stage}-targets"
        assert flag not in container["args"], "targets come from the ConfigMap"
        target = env[f"QWEN3TTS_{stage.upper()}_TARGETS"]
        match = re.fullmatch(r"dns:///([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", target)
        assert match, f"{target}: expected dns:///NAME.NS.svc.cluster.local:PORT"
        name, namespace, port = match.group(1), match.group(2), int(match.group(3))
        assert namespace == NAMESPACE
        assert name in services and services[name]["spec"].get("clusterIP") == "None"
        assert port == configs[stage].port
        assert port in {p["port"] for p in services[name]["spec"]["ports"]}


def test_disruption_budgets() -> None:
    budgets = objects_of("PodDisruptionBudget")
    labels = pod_labels()
    covered = []
    for name, budget in budgets.items():
        spec = budget["spec"]
        selected = [n for n, pod in labels.items() if labels_match(spec["selector"], pod)]
        assert len(selected) == 1, f"PDB {name} selects {selected}"
        covered += selected
        # maxUnavailable (not minAvailable: 1), so a single replica never blocks node drains.
        assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, name
    assert sorted(covered) == sorted(labels)


def test_network_policies_reference_real_pods_and_ports() -> None:
    labels = pod_labels()
    deployments = objects_of("Deployment")
    isolated = set()
    for name, policy in objects_of("NetworkPolicy").items():
        spec = policy["spec"]
        selected = [n for n, pod in labels.items() if labels_match(spec["podSelector"], pod)]
        assert selected, f"NetworkPolicy {name} selects no pod"
        isolated.update(selected)
        for rule in spec.get("ingress") or []:
            for peer in rule.get("from") or []:
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    assert any(labels_match(peer["podSelector"], pod) for pod in labels.values())
            for port in rule.get("ports") or []:
                for pod_name in selected:
                    assert port["port"] in container_ports(deployments[pod_name]), (name, port)
    assert isolated == set(labels), "every pod should be covered by a policy"
    # Both gateway APIs are reachable.
    gateway_ports = {
        port["port"]
        for policy in objects_of("NetworkPolicy").values()
        if labels_match(policy["spec"]["podSelector"], labels["gateway"])
        for rule in policy["spec"].get("ingress") or []
        for port in rule.get("ports") or []
    }
    assert {"grpc", "http"} <= gateway_ports
    # Stage gRPC ports: only the gateway may connect.
    (stage_policy,) = [
        p
        for p in objects_of("NetworkPolicy").values()
        if not labels_match(p["spec"]["podSelector"], labels["gateway"])
    ]
    grpc_rules = [r for r in stage_policy["spec"]["ingress"] if any(p["port"] == "grpc" for p in r["ports"])]
    (rule,) = grpc_rules
    (peer,) = rule["from"]
    assert labels_match(peer["podSelector"], labels["gateway"])
    assert not any(labels_match(peer["podSelector"], labels[s]) for s in GPU_STAGES)
    assert all(labels_match(stage_policy["spec"]["podSelector"], labels[s]) for s in GPU_STAGES)


def test_configmap_names_are_read_by_some_process() -> None:
    """Every key is a QWEN3TTS_ variable of a known stage (or a shared one): a misspelt stage
    prefix would silently be ignored by every process."""
    stages = set(DEFAULT_PORTS)
    for key in configmap_env():
        assert key.startswith("QWEN3TTS_"), key
        rest = key.removeprefix("QWEN3TTS_")
        first = rest.split("_", 1)[0].lower()
        assert first in stages or rest in {"MODEL", "DEV_MODEL", "GRACE_SECONDS", "LOG_LEVEL", "HOST"}, key
        assert not rest.endswith("_PORT"), f"{key}: ports are set per Deployment by flag"
