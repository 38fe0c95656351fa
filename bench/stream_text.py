"""Streamed-text bench: StreamingSynthesize fed like an LLM writes, against one-shot Synthesize.

Against a running gateway (e.g. ``qwen3-tts up`` on the dev checkpoint). A feeder writes a
deterministic paragraph in sub-word deltas (about ``--chars-per-token`` characters each, cut at
varying places inside words) at R deltas ("tokens") per second, for each R of ``--rates``, and all
at once (``inf``: every delta sent without waiting). For each rate and each concurrency of
``--concurrency`` (that many streams started together), it reports the medians of:

* ``first_delta_to_audio_ms``: from the first delta sent to the first audio chunk received;
* ``end_of_text_to_last_audio_ms``: from the half-close (end of text) to the last audio chunk
  (negative if the speech ended before the text did: the model's end of speech, or a budget);
* ``underruns`` / ``underrun_ms``: chunks arriving after the audio before them has played out
  (``playback.Playback``: a real-time player from the first chunk that resumes after each gap) (a slow feeder makes the talker wait: the summary's
  ``text_wait_ms`` and ``stalled_frames`` say for how long);

and the one-shot baseline at the same concurrency: Synthesize of the whole paragraph (same seed,
streaming text feeding), its time to first audio, and the ratio (issue 11's goal at R = 50:
first delta to audio <= 1.2 x one-shot TTFA).

    python bench/stream_text.py --gateway 127.0.0.1:50051 --speaker ryan --json bench/results/stream_text.json
    python bench/stream_text.py --speaker ryan --smoke     # one request of each kind
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from playback import Playback, PlayedStream

from qwen3_tts.request_flags import add_request_flags, request_from_flags
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc

PARAGRAPH = (
    "Sure! Here is what I found about the old lighthouse on the northern cape. It was built in "
    "1872 from local granite, and for almost a century its keepers lit the lamp every evening at "
    "dusk. Today it is a small museum; the stairs are steep, but the view over the bay is worth "
    "every step. Would you like me to check the opening hours for this weekend?"
)


def deltas_of(text: str, chars_per_token: float) -> list[str]:
    """``text`` in sub-word pieces of about ``chars_per_token`` characters, cut at varying
    offsets (deterministic), so words are split the way tokenizer output splits them."""
    pieces, i, k = [], 0, 0
    while i < len(text):
        size = max(1, round(chars_per_token * (0.5 + ((k * 7) % 5) / 4)))  # 0.5x .. 1.5x
        pieces.append(text[i : i + size])
        i += size
        k += 1
    return pieces


@dataclass
class Run(PlayedStream):
    """One stream's timings (seconds on the client's monotonic clock, reported in ms)."""

    first_delta_to_audio_ms: float = 0.0
    end_of_text_to_last_audio_ms: float = 0.0
    ttfa_ms: float = 0.0
    """From the call's start to the first audio (one-shot runs)."""
    chunks: int = 0
    text_wait_ms: float = 0.0
    stalled_frames: int = 0
    utterances: int = 0
    error: str = ""


def consume(responses: Iterator[tts_pb2.SynthesizeResponse], run: Run, clock: dict[str, float]) -> None:
    """Read a response stream as a real-time player (playback.Playback) would (fills ``run``)."""
    rate = 24000
    player = Playback()
    last_at = 0.0
    for response in responses:
        kind = response.WhichOneof("payload")
        now = time.monotonic()
        if kind == "metadata":
            rate = response.metadata.sample_rate or rate
        elif kind == "audio":
            player.chunk(now, response.audio.num_samples / rate)
            run.chunks += 1
            last_at = now
        elif kind == "utterance_end":
            run.utterances += 1
        elif kind == "summary":
            run.text_wait_ms = response.summary.text_wait_ms
            run.stalled_frames = response.summary.stalled_frames
    run.heard(player)
    first_at = player.first_at
    if first_at is not None:
        run.ttfa_ms = (first_at - clock["start"]) * 1000
        run.first_delta_to_audio_ms = (first_at - clock.get("first_delta", clock["start"])) * 1000
        run.end_of_text_to_last_audio_ms = (last_at - clock.get("end_of_text", clock["start"])) * 1000


def stream_once(
    stub: tts_pb2_grpc.TextToSpeechStub,
    config: tts_pb2.SynthesizeRequest,
    deltas: list[str],
    rate: float,
    deadline: float,
) -> Run:
    """One StreamingSynthesize call fed at ``rate`` deltas per second (inf: at once)."""
    run, clock = Run(), {"start": time.monotonic()}

    def messages() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        start = time.monotonic()
        clock["first_delta"] = start
        for k, delta in enumerate(deltas):
            if math.isfinite(rate):
                time.sleep(max(start + k / rate - time.monotonic(), 0.0))
            yield tts_pb2.StreamingSynthesizeRequest(text=delta)
        clock["end_of_text"] = time.monotonic()

    try:
        consume(stub.StreamingSynthesize(messages(), timeout=deadline), run, clock)
    except grpc.RpcError as exc:
        run.error = f"{exc.code().name}: {exc.details()}"
    return run


def synthesize_once(
    stub: tts_pb2_grpc.TextToSpeechStub, config: tts_pb2.SynthesizeRequest, text: str, deadline: float
) -> Run:
    """One-shot Synthesize of the whole text (the baseline)."""
    request = tts_pb2.SynthesizeRequest()
    request.CopyFrom(config)
    request.text = text
    run, clock = Run(), {"start": time.monotonic()}
    clock["first_delta"] = clock["end_of_text"] = clock["start"]
    try:
        consume(stub.Synthesize(request, timeout=deadline), run, clock)
    except grpc.RpcError as exc:
        run.error = f"{exc.code().name}: {exc.details()}"
    return run


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="127.0.0.1:50051")
    add_request_flags(ap, language="english", seed=1234, cloning=False, greedy=False)
    ap.add_argument("--rates", default="5,15,50,inf", help="deltas per second; inf = all at once")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--repeats", type=int, default=2, help="rounds per (rate, concurrency)")
    ap.add_argument("--chars-per-token", type=float, default=4.0)
    ap.add_argument("--deadline", type=float, default=600.0)
    ap.add_argument("--smoke", action="store_true", help="one stream at R = 50 and one Synthesize, then stop")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    config = request_from_flags(args, text_feeding=tts_pb2.TEXT_FEEDING_STREAMING)
    deltas = deltas_of(PARAGRAPH, args.chars_per_token)
    rates = [50.0] if args.smoke else [float(r) for r in args.rates.split(",")]
    levels = [1] if args.smoke else [int(c) for c in args.concurrency.split(",")]
    repeats = 1 if args.smoke else args.repeats

    report: dict[str, object] = {"chars": len(PARAGRAPH), "deltas": len(deltas), "results": []}
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    with grpc.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        with ThreadPoolExecutor(max_workers=max(levels)) as pool:
            for level in levels:
                one_shot: list[Run] = []
                for _ in range(repeats):
                    one_shot += pool.map(
                        lambda _: synthesize_once(stub, config, PARAGRAPH, args.deadline), range(level)
                    )
                baseline = median([r.ttfa_ms for r in one_shot if not r.error])
                for rate in rates:
                    runs: list[Run] = []
                    for _ in range(repeats):
                        runs += pool.map(
                            lambda _, r=rate: stream_once(stub, config, deltas, r, args.deadline),
                            range(level),
                        )
                    ok = [r for r in runs if not r.error]
                    first = median([r.first_delta_to_audio_ms for r in ok])
                    results.append(
                        {
                            "rate": "at once" if math.isinf(rate) else rate,
                            "concurrency": level,
                            "first_delta_to_audio_ms_median": first,
                            "end_of_text_to_last_audio_ms_median": median(
                                [r.end_of_text_to_last_audio_ms for r in ok]
                            ),
                            "underruns_median": median([float(r.underruns) for r in ok]),
                            "underrun_ms_median": median([r.underrun_ms for r in ok]),
                            "text_wait_ms_median": median([r.text_wait_ms for r in ok]),
                            "one_shot_ttfa_ms_median": baseline,
                            "ratio_to_one_shot": first / baseline if first and baseline else None,
                            "errors": [r.error for r in runs if r.error],
                            "runs": [r.figures() for r in runs],
                            "one_shot_runs": [r.figures() for r in one_shot],
                        }
                    )
                    print(
                        f"R={results[-1]['rate']} c={level}: first delta -> audio {first} ms "
                        f"(one-shot TTFA {baseline} ms), end of text -> last audio "
                        f"{results[-1]['end_of_text_to_last_audio_ms_median']} ms, "
                        f"underruns {results[-1]['underruns_median']}, errors {len(results[-1]['errors'])}",
                        flush=True,
                    )
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
