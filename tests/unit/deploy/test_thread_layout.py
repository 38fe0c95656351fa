"""Thread layout of model stages sharing one CPU host: `qwen3-tts up` and the CPU compose variant
give every stage all cores (no --threads) with passive OpenMP waiting."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3_tts.local_stack import SHARED_HOST_ENV, stage_commands, stage_environment
from tests.helpers.compose import MODEL_STAGES, VARIANTS, load_compose, process_args, processes


@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_local_stack_stages_get_all_cores(device: str | None) -> None:
    stages = stage_commands(Path("/models/x"), "127.0.0.1", 50051, 50052, device, metrics=False)
    for stage in stages:
        module = stage.args[2]
        assert "--threads" not in stage.args, stage.name
        if stage.name in MODEL_STAGES:
            assert module == f"{stage.name}_service"
            # The child's own parser: threads 0 = torch's default, every core.
            args = process_args(stage.name, stage.args[3:], stage_environment({}))
            assert args.threads == 0 and args.model == "/models/x"


def test_local_stack_children_wait_passively_unless_told_otherwise() -> None:
    assert SHARED_HOST_ENV == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = stage_environment({"PATH": "/bin", "OMP_WAIT_POLICY": ""})
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert stage_environment({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"


def test_local_stack_starts_children_with_that_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_local_stack hands stage_environment(os.environ) to every child it starts."""
    from qwen3_tts import local_stack
    from qwen3_tts.cli import build_parser

    seen: list[dict[str, str]] = []

    class RefusedError(RuntimeError):
        pass

    def fake_popen(args: list[str], env: dict[str, str]) -> None:
        seen.append(env)
        raise RefusedError

    class NoSignals:  # the real one installs SIGINT/SIGTERM handlers in the test process
        signal = None
        requested = False

    monkeypatch.setattr(local_stack.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(local_stack, "StopRequest", NoSignals)
    monkeypatch.setattr(local_stack, "busy_port", lambda stages: None)  # the default ports may be taken here
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    ns = build_parser().parse_args(["up", "--model", "/models/x", "--device", "cpu"])
    with pytest.raises(RefusedError):
        local_stack.run_local_stack(ns)
    assert seen and seen[0]["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize("policy", [None, "ACTIVE"])
def test_cpu_compose_stages_get_all_cores_and_wait_passively(policy: str | None) -> None:
    model = load_compose(VARIANTS["cpu"], {} if policy is None else {"OMP_WAIT_POLICY": policy})
    seen = set()
    for service, (stage, _) in processes(model).items():
        env = model["services"][service].get("environment") or {}
        if stage not in MODEL_STAGES:
            continue
        seen.add(stage)
        assert env["OMP_WAIT_POLICY"] == (policy or "PASSIVE"), service
        args = process_args(stage, model["services"][service]["command"][3:], env)
        assert args.threads == 0, service
    assert seen == set(MODEL_STAGES)
