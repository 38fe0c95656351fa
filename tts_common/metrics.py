"""Prometheus metrics of every qwen3-tts-grpc process, defined in one place.

All names start with ``qwen3tts_`` and carry a ``stage`` label (``gateway``, ``talker``,
``decoder``, ``speaker``, ``aligner``), so the processes can be scraped into one dashboard and compared
stage by stage. A gateway serving several models also counts its streams per model
(``qwen3tts_model_*``, with a ``model`` label: the served name); a stage process serves one model,
which its scrape target already says. Metrics live in prometheus_client's default registry; each process serves them
over HTTP with :func:`start_metrics_server` (``ServerConfig.metrics_port``; 0 disables it).

Usage::

    from tts_common import metrics
    metrics.QUEUE_TIME.labels(stage=metrics.STAGE_TALKER).observe(seconds)
    metrics.RUNNING_REQUESTS.labels(stage=metrics.STAGE_TALKER).set(n)
    metrics.REQUESTS.labels(stage=metrics.STAGE_GATEWAY, status="OK").inc()

Times are in seconds (Prometheus convention), not milliseconds.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server

logger = logging.getLogger(__name__)

PREFIX = "qwen3tts_"

STAGE_GATEWAY = "gateway"
STAGE_TALKER = "talker"
STAGE_DECODER = "decoder"
STAGE_SPEAKER = "speaker"
STAGE_ALIGNER = "aligner"
STAGES = (STAGE_GATEWAY, STAGE_TALKER, STAGE_DECODER, STAGE_SPEAKER, STAGE_ALIGNER)

# Bucket boundaries chosen around the interesting ranges: streaming TTS aims at first audio
# within a few hundred milliseconds and chunks every 80 ms .. 2 s.
_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)

REQUESTS = Counter(
    PREFIX + "requests_total",
    "Finished requests by final gRPC status name (OK, CANCELLED, INVALID_ARGUMENT, ...).",
    ["stage", "status"],
)
TIME_TO_FIRST_AUDIO = Histogram(
    PREFIX + "time_to_first_audio_seconds",
    "From request receipt to the first output of the stage (gateway: first audio chunk sent; "
    "talker: first codec frame; decoder: first PCM chunk).",
    ["stage"],
    buckets=_LATENCY_BUCKETS,
)
INTER_CHUNK_LATENCY = Histogram(
    PREFIX + "inter_chunk_latency_seconds",
    "Time between consecutive output chunks of one request.",
    ["stage"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    PREFIX + "queue_time_seconds",
    "Time a request waited before processing started (talker: until it got a batch slot).",
    ["stage"],
    buckets=_QUEUE_BUCKETS,
)
REQUEST_DURATION = Histogram(
    PREFIX + "request_duration_seconds",
    "Total time of a request in the stage, receipt to completion.",
    ["stage"],
    buckets=_DURATION_BUCKETS,
)
REAL_TIME_FACTOR = Histogram(
    PREFIX + "real_time_factor",
    "Processing time divided by produced audio duration, per request (< 1 = faster than real time).",
    ["stage"],
    buckets=_RTF_BUCKETS,
)
BATCH_SIZE = Histogram(
    PREFIX + "batch_size",
    "Requests in one batched forward step (talker decode step, decoder batch, ...).",
    ["stage"],
    buckets=_BATCH_BUCKETS,
)
STEP_DURATION = Histogram(
    PREFIX + "step_duration_seconds",
    "Duration of one batched forward step (talker: one frame for the whole batch, code predictor included).",
    ["stage"],
    buckets=_STEP_BUCKETS,
)
RUNNING_REQUESTS = Gauge(
    PREFIX + "running_requests",
    "Requests being processed now (talker: occupying a batch slot).",
    ["stage"],
)
WAITING_REQUESTS = Gauge(
    PREFIX + "waiting_requests",
    "Requests accepted and waiting to be processed.",
    ["stage"],
)
GENERATED_FRAMES = Counter(
    PREFIX + "generated_frames_total",
    "Codec frames produced (talker) or consumed (decoder).",
    ["stage"],
)
SELF_CHECK_FAILURES = Counter(
    PREFIX + "self_check_failures",
    "Startup self-checks of a stage's graph path that failed (the stage then serves on its eager path).",
    ["stage", "check"],
)
GRAPH_PATH = Gauge(
    PREFIX + "graph_path_enabled",
    "1 if the stage serves on its captured graph path, 0 if eager (off, or fallen back after a self-check).",
    ["stage"],
)
TEXT_WAIT_TIME = Histogram(
    PREFIX + "text_wait_seconds",
    "Per streamed-text request: time it held its batch slot waiting for text (its text used up).",
    ["stage"],
    buckets=_QUEUE_BUCKETS,
)
STALLED_FRAMES = Counter(
    PREFIX + "stalled_frames_total",
    "Frames delayed because a streamed-text request had used up its text (waits entered).",
    ["stage"],
)
TEXT_STREAMS = Gauge(
    PREFIX + "text_streams",
    "StreamingSynthesize streams (incremental text input) open now.",
    ["stage"],
)
CANCELLED_UTTERANCES = Counter(
    PREFIX + "cancelled_utterances_total",
    "Utterances of StreamingSynthesize streams stopped by the client's cancel (barge-in).",
    ["stage"],
)
AUDIO_SECONDS = Counter(
    PREFIX + "audio_seconds_total",
    "Seconds of audio produced.",
    ["stage"],
)
UTTERANCES = Counter(
    PREFIX + "utterances_total",
    "Utterances (talker requests; a long text has one per segment) whose audio was delivered, by "
    "finish reason: EOS, LENGTH (hit the frame budget), SILENCE (ended by the silence stop).",
    ["stage", "finish_reason"],
)
CACHE_LOOKUPS = Counter(
    PREFIX + "cache_lookups_total",
    "Cache lookups by result (hit | miss), e.g. the speaker stage's reference cache.",
    ["stage", "result"],
)
READY = Gauge(
    PREFIX + "ready",
    "1 while the process reports SERVING for its services (readiness; the gateway also needs a "
    "reachable talker and decoder), else 0.",
    ["stage"],
)
FAILOVERS = Counter(
    PREFIX + "failovers_total",
    "Stage calls moved to another replica after a connection-level failure, by the failed stage "
    "(peer: talker, decoder, speaker, aligner) and result: ok; refused (the replacement talker produced "
    "different frames); exhausted (no healthy replica or no attempt left); not_replayable (the "
    "stream is longer than the frames kept for replay).",
    ["stage", "peer", "result"],
)
FAILOVER_SECONDS = Histogram(
    PREFIX + "failover_seconds",
    "From a stage call's failure to the replacement's first new output (talker: the first frame "
    "past those already forwarded; decoder: the first sample the client did not have yet).",
    ["stage", "peer"],
    buckets=_LATENCY_BUCKETS,
)

MODEL_STREAMS = Counter(
    PREFIX + "model_streams_total",
    "Gateway: finished synthesis streams (Synthesize, StreamingSynthesize) per served model, by "
    "final gRPC status name.",
    ["stage", "model", "status"],
)
MODEL_RUNNING_STREAMS = Gauge(
    PREFIX + "model_running_streams",
    "Gateway: synthesis streams running now per served model.",
    ["stage", "model"],
)
MODEL_TIME_TO_FIRST_AUDIO = Histogram(
    PREFIX + "model_time_to_first_audio_seconds",
    "Gateway: from request receipt to the first audio chunk sent, per served model.",
    ["stage", "model"],
    buckets=_LATENCY_BUCKETS,
)
MODEL_AUDIO_SECONDS = Counter(
    PREFIX + "model_audio_seconds",
    "Gateway: seconds of audio sent per served model.",
    ["stage", "model"],
)

_ALL = (
    REQUESTS,
    TIME_TO_FIRST_AUDIO,
    INTER_CHUNK_LATENCY,
    QUEUE_TIME,
    REQUEST_DURATION,
    REAL_TIME_FACTOR,
    BATCH_SIZE,
    STEP_DURATION,
    RUNNING_REQUESTS,
    WAITING_REQUESTS,
    GENERATED_FRAMES,
    TEXT_WAIT_TIME,
    STALLED_FRAMES,
    TEXT_STREAMS,
    CANCELLED_UTTERANCES,
    AUDIO_SECONDS,
    UTTERANCES,
    CACHE_LOOKUPS,
    READY,
    FAILOVERS,
    FAILOVER_SECONDS,
    MODEL_STREAMS,
    MODEL_RUNNING_STREAMS,
    MODEL_TIME_TO_FIRST_AUDIO,
    MODEL_AUDIO_SECONDS,
    SELF_CHECK_FAILURES,
    GRAPH_PATH,
)


def _exposed_name(metric: Counter | Gauge | Histogram) -> str:
    family = metric.describe()[0]
    return family.name + "_total" if family.type == "counter" else family.name


METRIC_NAMES: tuple[str, ...] = tuple(_exposed_name(m) for m in _ALL)
"""Every metric defined here, as named on the ``# TYPE`` lines of ``/metrics``."""


def init_stage(stage: str) -> None:
    """Create the unlabelled-by-outcome series of ``stage`` at zero, so dashboards show the
    stage's gauges and histograms before the first request (Prometheus omits unseen labels)."""
    for metric in (
        TIME_TO_FIRST_AUDIO,
        INTER_CHUNK_LATENCY,
        QUEUE_TIME,
        REQUEST_DURATION,
        REAL_TIME_FACTOR,
        BATCH_SIZE,
        STEP_DURATION,
        RUNNING_REQUESTS,
        WAITING_REQUESTS,
        GENERATED_FRAMES,
        AUDIO_SECONDS,
        READY,
    ):
        metric.labels(stage=stage)


def init_model(model: str, stage: str = STAGE_GATEWAY) -> None:
    """Create the per-model series of a served ``model`` at zero (a gateway, at startup)."""
    for metric in (MODEL_RUNNING_STREAMS, MODEL_TIME_TO_FIRST_AUDIO, MODEL_AUDIO_SECONDS):
        metric.labels(stage=stage, model=model)


@dataclass
class MetricsServer:
    """A running metrics HTTP endpoint (``GET /metrics``); :meth:`close` stops it."""

    host: str
    port: int
    _httpd: object
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()  # type: ignore[attr-defined]
        self._httpd.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


def start_metrics_server(
    port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY
) -> MetricsServer | None:
    """Serve ``registry`` in the Prometheus text format on ``host:port`` from a daemon thread.

    ``port`` 0 disables metrics and returns None (a configuration default, not "any port").
    """
    if port <= 0:
        return None
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    bound = int(httpd.server_address[1])
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return MetricsServer(host=host, port=bound, _httpd=httpd, _thread=thread)


__all__ = [
    "AUDIO_SECONDS",
    "BATCH_SIZE",
    "CACHE_LOOKUPS",
    "FAILOVERS",
    "FAILOVER_SECONDS",
    "GRAPH_PATH",
    "GENERATED_FRAMES",
    "INTER_CHUNK_LATENCY",
    "METRIC_NAMES",
    "MODEL_AUDIO_SECONDS",
    "MODEL_RUNNING_STREAMS",
    "MODEL_STREAMS",
    "MODEL_TIME_TO_FIRST_AUDIO",
    "MetricsServer",
    "PREFIX",
    "QUEUE_TIME",
    "READY",
    "REAL_TIME_FACTOR",
    "REQUESTS",
    "REQUEST_DURATION",
    "RUNNING_REQUESTS",
    "SELF_CHECK_FAILURES",
    "STAGES",
    "STAGE_DECODER",
    "STAGE_GATEWAY",
    "STAGE_SPEAKER",
    "STAGE_TALKER",
    "STEP_DURATION",
    "TIME_TO_FIRST_AUDIO",
    "UTTERANCES",
    "WAITING_REQUESTS",
    "init_model",
    "init_stage",
    "start_metrics_server",
]
