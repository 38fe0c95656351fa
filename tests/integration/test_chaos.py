"""Chaos (issue 13): the real local stack with 2 talker and 2 decoder replicas under a closed
loop of seeded streams; a replica is SIGKILLed (and restarted) and another frozen with SIGSTOP
mid-stream. No stream may fail and every stream's audio must equal its undisturbed reference
within the streaming tolerance. Short on purpose (the suite must stay fast); the full 60 s run
is ``python scripts/chaos.py``."""

from __future__ import annotations

from pathlib import Path

from qwen3_tts.chaos import ChaosConfig, run_chaos
from tests.helpers.fixtures import CKPT_DIR


def test_streams_survive_killed_and_frozen_replicas(tmp_path: Path) -> None:
    config = ChaosConfig(
        duration=12.0,
        streams=4,
        requests=2,
        kill_every=7.0,  # one SIGKILL (+ restart), at 7 s
        stop_at=2.0,  # one SIGSTOP, longer than the keepalive window (2 s + 2 s)
        stop_seconds=6.0,
        max_new_tokens=48,
    )
    report = run_chaos(CKPT_DIR / "tiny_custom_voice", tmp_path / "logs", config)
    summary = report.summary()
    print(summary)
    kinds = [fault.split(": ")[1].split()[0] for fault in report.faults]
    assert kinds.count("SIGKILL") == 1 and kinds.count("SIGSTOP") == 1, summary
    assert report.streams, summary
    assert not report.failed, summary
    assert not report.mismatched, summary
    assert sum(n for (_, result), n in report.failovers.items() if result == "ok") >= 1, summary
    assert all(result == "ok" for _, result in report.failovers), summary
    assert len(report.failover_delays) >= 1, summary
