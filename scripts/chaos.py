#!/usr/bin/env python3
"""Chaos run for operators: kill and freeze stage replicas under streaming load, check the audio.

Starts its own local stack (gateway, speaker, N talker and N decoder replicas on free loopback
ports), runs a closed loop of concurrent seeded streams, SIGKILLs (and restarts) one replica every
``--kill-every`` seconds and SIGSTOPs one for ``--stop-seconds``, then checks every stream's audio
against an undisturbed run of the same request and prints the failovers and the extra delay a
listener heard (p50/p95). Exit 0 iff no stream failed or differed. See deploy/OPERATIONS.md
("Surviving the loss of a stage replica").

    python scripts/chaos.py                                  # the dev checkpoint, 60 s
    python scripts/chaos.py --model /srv/models/Qwen3-TTS-12Hz-0.6B-CustomVoice --device cuda
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from qwen3_tts.chaos import ChaosConfig, run_chaos


def main() -> int:
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, help="checkpoint directory (default: a voice_design dev checkpoint)"
    )
    parser.add_argument("--duration", type=float, default=defaults.duration)
    parser.add_argument("--streams", type=int, default=defaults.streams)
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--kill-every", type=float, default=defaults.kill_every, help="seconds; 0 = no kills")
    parser.add_argument(
        "--stop-at", type=float, default=defaults.stop_at, help="seconds; negative = no SIGSTOP"
    )
    parser.add_argument("--stop-seconds", type=float, default=defaults.stop_seconds)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--log-dir", type=Path, help="process logs (default: a temporary directory)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from qwen3_tts.dev_model import make_dev_model

        model = Path(".dev-model") / "voice_design"
        make_dev_model(model, "voice_design", if_missing=True)
    config = ChaosConfig(
        duration=args.duration,
        streams=args.streams,
        replicas=args.replicas,
        kill_every=args.kill_every,
        stop_at=args.stop_at if args.stop_at is not None and args.stop_at >= 0 else None,
        stop_seconds=args.stop_seconds,
        max_new_tokens=args.max_new_tokens,
    )
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="qwen3tts-chaos-"))
    report = run_chaos(model.resolve(), log_dir, config)
    print(report.summary())
    print(f"logs: {log_dir}")
    return 0 if not report.failed and not report.mismatched else 1


if __name__ == "__main__":
    sys.exit(main())
