"""Word timestamps bench: how far ahead of playback each word's timing arrives, what alignment
costs, and what asking for timestamps does to TTFA and RTF.

Against a running gateway with an aligner stage (``qwen3-tts up``: the dev checkpoints by
default). Two workloads, each at every concurrency of ``--concurrency`` (that many streams
started together):

* ``streamed``: StreamingSynthesize fed ``stream_text.PARAGRAPH`` in sub-word deltas at
  ``--rate`` deltas per second (an LLM writing);
* ``long``: Synthesize of a ``--chars``-character text (``long_text.chapter``), several segments;

each run with timestamps off and on, alternating (off, on, off, on, ...: A/B side by side, so
the shared machine's noise hits both alike). Per stream, a real-time player starts at the first
audio chunk (``playback.Playback``, waiting out underruns); it reports:

* ``lead_ms``: for every word, the time its timing arrived before the player plays its first
  sample (negative: after the listener heard it) -- median, 5th percentile, share negative;
* ``align_delay_ms``: from the last audio chunk of an utterance to its timings;
* ``ttfa_ms`` (streamed: from the first delta) and ``rtf`` (the server's summary), on vs off,
  medians and their ratio;

and the alignment cost: each long-text segment's audio aligned again directly on the aligner
stage (``--aligner``, Align RPC), at each concurrency (so the stage batches), per second of
audio: the forward pass's time (``align_ms``, shared by a batch), each call's client time, and
the wall time of all calls over all their audio (the stage's cost at that load).

    python bench/timestamps.py --instruct "A calm voice." --json bench/results/timestamps.json
    python bench/timestamps.py --instruct "A calm voice." --smoke
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from long_text import chapter
from playback import Playback, PlayedStream
from stream_text import PARAGRAPH, deltas_of

from qwen3_tts.request_flags import add_request_flags, request_from_flags
from tts_common.cpu_info import cpu_identity
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2, tts_pb2_grpc


@dataclass
class Stream(PlayedStream):
    """One stream's figures."""

    ttfa_ms: float = 0.0
    rtf: float = 0.0
    words: int = 0
    lead_ms: list[float] = field(default_factory=list, repr=False)
    align_delay_ms: list[float] = field(default_factory=list, repr=False)
    segments: list[tuple[str, np.ndarray]] = field(default_factory=list, repr=False)
    """(text, float32 audio) of each utterance (long text: to align again directly)."""
    error: str = ""


def consume(
    responses: Iterator[tts_pb2.SynthesizeResponse], start: float, text: str, keep_audio: bool
) -> Stream:
    """Read a response stream as a real-time player would (see the module doc)."""
    stream, player, rate = Stream(), Playback(), 24000
    starts: list[int] = []  # each chunk's first sample
    plays: list[float] = []  # when the player starts playing it
    last_audio_at = 0.0
    pieces: list[np.ndarray] = []
    for response in responses:
        kind = response.WhichOneof("payload")
        now = time.monotonic()
        if kind == "metadata":
            rate = response.metadata.sample_rate or rate
        elif kind == "audio":
            if player.first_at is None:
                stream.ttfa_ms = (now - start) * 1000
            player.chunk(now, response.audio.num_samples / rate)
            # it plays once the audio before it has played out, or now if that was earlier
            starts.append(response.audio.start_sample)
            plays.append(
                player.first_at + player.stalled_s + player.played_s - response.audio.num_samples / rate
            )
            last_audio_at = now
            if keep_audio:
                pieces.append(np.frombuffer(response.audio.data, "<f4"))
        elif kind == "timestamps":
            stream.align_delay_ms.append((now - last_audio_at) * 1000)
            for unit in response.timestamps.units:
                k = bisect.bisect_right(starts, unit.start_sample) - 1
                heard_at = plays[k] + (unit.start_sample - starts[k]) / rate
                stream.lead_ms.append((heard_at - now) * 1000)
            stream.words += len(response.timestamps.units)
        elif kind == "summary":
            stream.rtf = response.summary.rtf
            if keep_audio:
                audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
                stream.segments = [
                    (text[s.text_start : s.text_end], audio[s.start_sample : s.start_sample + s.num_samples])
                    for s in response.summary.segments
                ]
    stream.heard(player)
    return stream


def run_long(
    stub: tts_pb2_grpc.TextToSpeechStub, config: tts_pb2.SynthesizeRequest, text: str, deadline: float
) -> Stream:
    request = tts_pb2.SynthesizeRequest()
    request.CopyFrom(config)
    request.text = text
    request.output.encoding = tts_pb2.AUDIO_ENCODING_FLOAT32
    start = time.monotonic()
    try:
        return consume(stub.Synthesize(request, timeout=deadline), start, text, keep_audio=True)
    except grpc.RpcError as exc:
        return Stream(error=f"{exc.code().name}: {exc.details()}")


def run_streamed(
    stub: tts_pb2_grpc.TextToSpeechStub,
    config: tts_pb2.SynthesizeRequest,
    deltas: list[str],
    rate: float,
    deadline: float,
) -> Stream:
    clock: dict[str, float] = {}

    def messages() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        clock["first_delta"] = begun = time.monotonic()
        for k, delta in enumerate(deltas):
            if math.isfinite(rate):
                time.sleep(max(begun + k / rate - time.monotonic(), 0.0))
            yield tts_pb2.StreamingSynthesizeRequest(text=delta)

    start = time.monotonic()
    try:
        stream = consume(stub.StreamingSynthesize(messages(), timeout=deadline), start, "", keep_audio=False)
    except grpc.RpcError as exc:
        return Stream(error=f"{exc.code().name}: {exc.details()}")
    stream.ttfa_ms -= (clock.get("first_delta", start) - start) * 1000  # from the first delta
    return stream


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: list[Stream]) -> dict[str, object]:
    ok = [r for r in runs if not r.error]
    leads = [x for r in ok for x in r.lead_ms]
    return {
        "streams": len(runs),
        "errors": [r.error for r in runs if r.error],
        "ttfa_ms_median": median([r.ttfa_ms for r in ok]),
        "rtf_median": median([r.rtf for r in ok]),
        "audio_s_median": median([r.audio_s for r in ok]),
        "underruns_median": median([float(r.underruns) for r in ok]),
        "words": sum(r.words for r in ok),
        "lead_ms_median": median(leads),
        "lead_ms_p5": percentile(leads, 5),
        "lead_negative_share": sum(x < 0 for x in leads) / len(leads) if leads else None,
        "align_delay_ms_median": median([x for r in ok for x in r.align_delay_ms]),
    }


def align_cost(
    address: str, segments: list[tuple[str, np.ndarray]], level: int, language: str
) -> dict[str, object]:
    """The segments aligned directly on the aligner stage, ``level`` at a time."""

    def align(item: tuple[str, np.ndarray]) -> tuple[float, float, float]:
        text, audio = item
        request = stages_pb2.AlignRequest(
            pcm=audio.astype("<f4").tobytes(), sample_rate=24000, text=text, language=language.lower()
        )
        began = time.monotonic()
        reply = stub.Align(request, timeout=300)
        return reply.align_ms, (time.monotonic() - began) * 1000, audio.size / 24000

    with grpc.insecure_channel(address) as channel:
        stub = stages_pb2_grpc.AlignerStub(channel)
        align(segments[0])  # warm-up
        items = segments * math.ceil(2 * level / len(segments))  # every worker busy twice over
        with ThreadPoolExecutor(max_workers=level) as pool:
            began = time.monotonic()
            results = list(pool.map(align, items))
            wall = time.monotonic() - began
    audio_s = sum(r[2] for r in results)
    return {
        "concurrency": level,
        "utterances": len(results),
        "audio_s": audio_s,
        # a batch's forward pass carries several requests: its time is each one's align_ms
        "forward_ms_per_audio_s_median": median([r[0] / r[2] for r in results]),
        "client_ms_per_audio_s_median": median([r[1] / r[2] for r in results]),
        "wall_ms_per_audio_s": wall * 1000 / audio_s,
        "throughput_audio_s_per_s": audio_s / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="127.0.0.1:50051")
    ap.add_argument("--aligner", default="127.0.0.1:50055", help="the aligner stage (up's default port)")
    add_request_flags(ap, language="english", seed=1234, max_new_tokens=48, cloning=False, greedy=False)
    ap.add_argument("--workloads", default="streamed,long", help="which of streamed, long")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--repeats", type=int, default=2, help="off/on pairs per (workload, concurrency)")
    ap.add_argument("--rate", type=float, default=15.0, help="streamed text: deltas per second")
    ap.add_argument("--chars", type=int, default=1500, help="long text: its length (several segments)")
    ap.add_argument("--deadline", type=float, default=600.0)
    ap.add_argument("--smoke", action="store_true", help="one pair of each workload at concurrency 1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    levels = [1] if args.smoke else [int(c) for c in args.concurrency.split(",")]
    repeats = 1 if args.smoke else args.repeats
    base = request_from_flags(args, text_feeding=tts_pb2.TEXT_FEEDING_STREAMING)
    text, deltas = chapter(args.chars), deltas_of(PARAGRAPH, 4.0)
    report: dict[str, object] = {
        "cpu": cpu_identity(),
        "machine": "shared with other agents' work (noisy figures; on and off alternate to share the noise)",
        "long_text_chars": len(text),
        "streamed_deltas": len(deltas),
        "rate": args.rate,
        "results": [],
    }
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    segments: list[tuple[str, np.ndarray]] = []
    with grpc.insecure_channel(args.gateway) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        with ThreadPoolExecutor(max_workers=max(levels)) as pool:
            for workload in args.workloads.split(","):
                for level in levels:
                    runs: dict[str, list[Stream]] = {"off": [], "on": []}
                    for _ in range(repeats):
                        for mode in ("off", "on"):
                            config = tts_pb2.SynthesizeRequest()
                            config.CopyFrom(base)
                            if mode == "on":
                                config.timestamps = tts_pb2.TIMESTAMP_UNIT_WORD

                            def one(
                                _: int, c: tts_pb2.SynthesizeRequest = config, w: str = workload
                            ) -> Stream:
                                if w == "long":
                                    return run_long(stub, c, text, args.deadline)
                                return run_streamed(stub, c, deltas, args.rate, args.deadline)

                            runs[mode] += pool.map(one, range(level))
                    off, on = summarize(runs["off"]), summarize(runs["on"])
                    if workload == "long":
                        segments += [s for r in runs["on"] for s in r.segments if s[1].size]

                    def ratio(
                        key: str, a: dict[str, object] = on, b: dict[str, object] = off
                    ) -> float | None:
                        x, y = a[key], b[key]
                        return x / y if isinstance(x, float) and isinstance(y, float) and y else None

                    row = {
                        "workload": workload,
                        "concurrency": level,
                        "off": off,
                        "on": on,
                        "ttfa_on_over_off": ratio("ttfa_ms_median"),
                        "rtf_on_over_off": ratio("rtf_median"),
                    }
                    results.append(row)
                    print(
                        f"{workload} c={level}: TTFA off {off['ttfa_ms_median']} / on {on['ttfa_ms_median']} ms "
                        f"(x{row['ttfa_on_over_off']}), RTF off {off['rtf_median']} / on {on['rtf_median']}; "
                        f"{on['words']} words, lead median {on['lead_ms_median']} ms, p5 {on['lead_ms_p5']} ms, "
                        f"late share {on['lead_negative_share']}; align delay {on['align_delay_ms_median']} ms; "
                        f"errors {len(off['errors']) + len(on['errors'])}",
                        flush=True,
                    )
    if segments:
        unique = list({t: (t, a) for t, a in segments}.values())
        report["align_cost"] = [align_cost(args.aligner, unique, level, args.language) for level in levels]
        for cost in report["align_cost"]:  # type: ignore[attr-defined]
            print(f"align cost: {cost}", flush=True)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
