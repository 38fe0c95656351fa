"""Registration and lookup latency of the voice library on both back ends.

For each back end (SQLite in a temporary file; PostgreSQL at ``--postgres``, in a schema of its
own that is dropped afterwards), ``--operations`` registrations one at a time, then as many
lookups (``get`` of a random registered voice, what every synthesis with a stored voice does),
then listings of one page. The back ends take turns in rounds of ``--round`` operations, so a
noisy shared machine disturbs both alike. Payloads are release-sized: a 2048-value embedding
(1.7B talker) and 10 s of reference codes (125 frames x 16 codebooks).

    python bench/voice_store.py                                  # 1,000 of each, both back ends
    python bench/voice_store.py --postgres postgresql://u:p@db/x --json bench/results/voice_store.json

Prints p50/p95/mean per back end and operation (ms) and the CPU model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from gateway.voice_library import (
    NewVoice,
    RefCodes,
    Scope,
    VoiceLibrary,
    VoiceLibraryConfig,
    create_voice_library,
)
from tts_common.cpu_info import cpu_identity

OWNER = Scope(owner="0" * 64)


def voice(rng: np.random.Generator) -> NewVoice:
    return NewVoice(
        speaker_embedding=rng.standard_normal(2048).astype(np.float32),
        ref_codes=RefCodes.from_flat(rng.integers(0, 2048, 125 * 16), 125, 16),
        x_vector_only=False,
        ref_text="A reference transcript of about ten seconds of speech, as users record them.",
        name="bench voice",
        model_family="1.7B/qwen3-tts-tokenizer-12hz",
    )


def stats(samples: list[float]) -> dict[str, float]:
    arr = np.asarray(samples) * 1000.0
    return {
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "mean": float(arr.mean()),
    }


async def timed(samples: list[float], operation: Any) -> Any:
    started = time.perf_counter()
    result = await operation
    samples.append(time.perf_counter() - started)
    return result


async def bench(
    libraries: dict[str, VoiceLibrary], operations: int, round_size: int
) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(0)
    pick = random.Random(0)
    ids: dict[str, list[str]] = {name: [] for name in libraries}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"register": [], "get": [], "list100": []} for name in libraries
    }
    for phase, count in (
        ("register", operations),
        ("get", operations),
        ("list100", max(operations // 10, 1)),
    ):
        done = 0
        while done < count:
            for name, library in libraries.items():
                for _ in range(min(round_size, count - done)):
                    if phase == "register":
                        record = await timed(samples[name][phase], library.add(voice(rng), OWNER))
                        ids[name].append(record.voice_id)
                    elif phase == "get":
                        await timed(samples[name][phase], library.get(pick.choice(ids[name]), OWNER))
                    else:
                        await timed(samples[name][phase], library.list_voices(OWNER, page_size=100))
            done += min(round_size, count - done)
    return {name: {op: stats(values) for op, values in ops.items()} for name, ops in samples.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=1000, help="registrations, and lookups (each)")
    parser.add_argument("--round", type=int, default=50, help="operations per back end per turn")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test", help="'' skips it")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        settings = VoiceLibraryConfig(max_voices=args.operations + 1, postgres_schema=schema)
        libraries = {"sqlite": create_voice_library(Path(tmp) / "voices.db", settings)}
        if args.postgres:
            libraries["postgresql"] = create_voice_library(args.postgres, settings)
        try:
            for library in libraries.values():
                await library.start()
            results = await bench(libraries, args.operations, args.round)
        finally:
            for library in libraries.values():
                await library.close()
            if args.postgres:
                import asyncpg

                conn = await asyncpg.connect(args.postgres)
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                await conn.close()
    report = {"cpu": cpu_identity(), "operations": args.operations, "results": results}
    print(f"CPU: {report['cpu']}; {args.operations} operations each, one at a time")
    print(f"{'back end':<12}{'operation':<11}{'p50 ms':>9}{'p95 ms':>9}{'mean ms':>9}")
    for name, ops in results.items():
        for op, figures in ops.items():
            print(f"{name:<12}{op:<11}{figures['p50']:>9.3f}{figures['p95']:>9.3f}{figures['mean']:>9.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
