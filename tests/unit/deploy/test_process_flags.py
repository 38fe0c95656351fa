"""The command lines of the five processes, pinned: deploy/ (compose, k8s, the image entrypoint)
and operators' environments use these flag names, environment variables and defaults, so a
change to a config dataclass must not rename, drop or re-default any of them by accident."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tests.helpers.compose import process_flags
from tts_common.memory import MemoryBudget
from tts_common.stage_main import default_device

SERVER = {
    "--host": "[::]",
    "--port": None,  # per process, below
    "--metrics-host": "0.0.0.0",
    "--metrics-port": 0,
    "--max-receive-message-bytes": 64 * 1024 * 1024,
    "--max-send-message-bytes": 64 * 1024 * 1024,
    "--grace-seconds": 30.0,
    "--max-connection-age-seconds": 300.0,
    "--max-connection-age-grace-seconds": 0.0,
    "--log-level": "INFO",
}
MODEL = {"--model": "", "--device": None, "--dtype": "float32", "--threads": 0}
OWN: dict[str, dict[str, Any]] = {
    "gateway": {
        "--talker-targets": (),
        "--decoder-targets": (),
        "--speaker-targets": (),
        "--aligner-targets": (),
        "--models": (),
        "--default-model": "",
        "--model-alias": (),
        "--max-concurrent-streams": 64,
        "--max-text-chars": 100_000,
        "--max-instruct-chars": 2000,
        "--max-ref-audio-seconds": 60.0,
        "--max-ref-audio-bytes": 32 * 1024 * 1024,
        "--voices-db": None,
        "--voices-db-schema": "public",
        "--voices-db-timeout": 5.0,
        "--voices-dir": None,
        "--max-voices": 1000,
        "--max-voices-per-key": 0,
        "--api-keys": frozenset(),
        "--voices-admin-keys": frozenset(),
        "--voices-owner-secret": None,
        "--api-keys-file": None,
        "--tls-cert": None,
        "--tls-key": None,
        "--tls-client-ca": None,
        "--default-first-chunk-frames": 2,
        "--default-max-chunk-frames": 25,
        "--stage-timeout-seconds": 30.0,
        "--startup-timeout-seconds": 0.0,
        "--model-info-ttl-seconds": 60.0,
        "--http-port": 8000,
        "--http-host": None,
        "--http-max-body-bytes": 1024 * 1024,
        "--http-max-header-bytes": 16 * 1024,
        "--http-max-headers": 100,
        "--websocket-config-timeout-seconds": 10.0,
        "--voice-alias": (),
        "--health-check-interval-seconds": 1.0,
        "--health-check-timeout-seconds": 2.0,
        "--keepalive-seconds": 2.0,
        "--keepalive-timeout-seconds": 2.0,
        "--failover-attempts": 3,
        "--failover-wait-seconds": 3.0,
        "--failover-max-frames": 4096,
        "--segment-tokens": 0,
        "--text-idle-timeout-seconds": 30.0,
        "--segment-lookahead": 1,
        "--no-silence-stop": True,
        "--silence-threshold-dbfs": -45.0,
        "--silence-stop-seconds": 2.0,
    },
    "talker": {
        **MODEL,
        "--max-slots": 16,
        "--max-seq-len": 2048,
        "--max-waiting": 64,
        "--max-prefills-per-step": 4,
        "--cuda-graphs": "auto",
        "--kv-memory": MemoryBudget(fraction=0.5),
        "--other-stages-memory": 0,
        "--linear": "auto",
        "--quantization": "none",
    },
    "decoder": {
        **MODEL,
        "--max-streams": 64,
        "--cuda-graphs": "auto",
        "--graph-memory": 4 * 2**30,
        "--playout-headroom-ms": 0.0,
    },
    "speaker": {**MODEL, "--cache-size": 256, "--max-audio-seconds": 60.0},
    "aligner": {**MODEL, "--max-batch-size": 8, "--batch-wait-ms": 5.0, "--max-audio-seconds": 0.0},
}
PORTS = {"gateway": 50051, "talker": 50052, "decoder": 50053, "speaker": 50054, "aligner": 50055}
STAGE_ONLY_ENV = {"--port", "--metrics-port", "--http-port", "--voices-owner-secret"}
"""One QWEN3TTS_PORT shared by four processes on a host would make them collide; the voice owner
secret is the gateway's alone."""


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.dest != "help"}


def _expected_defaults(stage: str) -> dict[str, Any]:
    expected = {**OWN[stage], **SERVER, "--port": PORTS[stage]}
    if stage != "gateway":
        expected["--host"] = "127.0.0.1"  # model stages listen on loopback
        expected["--device"] = default_device()
    return expected


@pytest.mark.parametrize("stage", sorted(PORTS))
def test_flags_and_defaults(stage: str) -> None:
    flags = process_flags(stage)
    parser = flags.parser({})
    options = _options(parser)
    expected = _expected_defaults(stage)
    assert sorted(options) == sorted(expected)
    namespace = parser.parse_args([])
    assert {o: getattr(namespace, a.dest) for o, a in options.items()} == expected
    assert flags.server_config(namespace).stage == stage


@pytest.mark.parametrize("stage", sorted(PORTS))
def test_environment_variables(stage: str) -> None:
    flags = process_flags(stage)
    expected = set()
    for option in _expected_defaults(stage):
        key = option.removeprefix("--").replace("-", "_").upper()
        expected.add(f"QWEN3TTS_{stage.upper()}_{key}")
        if option not in STAGE_ONLY_ENV:
            expected.add(f"QWEN3TTS_{key}")
    assert set(flags.env_names()) == expected
    # Each variable reaches its flag: the stage-specific one beats the generic one.
    values = {
        "--dtype": "bfloat16",
        "--cuda-graphs": "off",
        "--log-level": "DEBUG",
        "--voice-alias": "alloy=vivian",
        "--models": "m7: talker=a:7",
        "--model-alias": "tts-7=m7",
        "--no-silence-stop": "1",
        "--silence-threshold-dbfs": "-30",
        "--kv-memory": "7GiB",
        "--other-stages-memory": "3GiB",
        "--graph-memory": "3GiB",
        "--linear": "torch",
        "--quantization": "int8",
    }
    for option, action in _options(flags.parser({})).items():
        key = option.removeprefix("--").replace("-", "_").upper()
        text = values.get(option, "7")
        env = {f"QWEN3TTS_{stage.upper()}_{key}": text}
        if option not in STAGE_ONLY_ENV:
            env[f"QWEN3TTS_{key}"] = "8"
        got = getattr(flags.parser(env).parse_args([]), action.dest)
        direct = getattr(
            flags.parser({}).parse_args([option] if action.nargs == 0 else [option, text]), action.dest
        )
        assert got == direct, (option, got, direct)
