"""Gateway settings: the :class:`GatewayConfig` dataclass, which also defines the gateway's
command-line flags (:mod:`tts_common.flags`), and :data:`FLAGS`, the process's command line.

Every flag can also come from the environment, most specific first:
``QWEN3TTS_GATEWAY_<FIELD>`` then ``QWEN3TTS_<FIELD>`` (e.g. ``--talker-targets`` ←
``QWEN3TTS_GATEWAY_TALKER_TARGETS`` / ``QWEN3TTS_TALKER_TARGETS``). Command-line flags win.
The standard server flags (host, port, metrics, message sizes, grace, log level) follow them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tts_common.chunking import DEFAULT_FIRST_CHUNK_FRAMES, DEFAULT_MAX_CHUNK_FRAMES, MAX_CHUNK_FRAMES
from tts_common.flags import (
    NOT_A_FLAG,
    comma_list,
    config_from_args,
    flag,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from tts_common.serving.config import ProcessFlags
from tts_common.silence import SilenceStop
from tts_common.synthesis.validation import RequestLimits

from .voice_library.config import VoiceLibraryConfig

STAGE = "gateway"
DEFAULT_PORT = 50051
DEFAULT_HTTP_PORT = 8000

_POSITIVE_INT = flag(parse=positive_int)
_POSITIVE_FLOAT = flag(parse=positive_float)
_NON_NEGATIVE_INT = flag(parse=non_negative_int)


def dbfs_level(text: str) -> float:
    """A level in dBFS: a finite ``float`` < 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value < 0):
        raise argparse.ArgumentTypeError(f"must be a level below 0 dBFS, got {text}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0..65535 (what 0 means is the flag's business)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def _parse_aliases(text: str, what: str, target: str) -> tuple[tuple[str, str], ...]:
    """Comma-separated ``ALIAS=TARGET`` pairs; an alias is matched case-insensitively (stored
    lower-cased) and may appear once."""
    pairs: dict[str, str] = {}
    for item in comma_list(text):
        alias, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not alias or not value:
            raise argparse.ArgumentTypeError(f"{what} alias {item!r} is not ALIAS={target}")
        if alias.lower() in pairs:
            raise argparse.ArgumentTypeError(f"{what} alias {alias!r} is given twice")
        pairs[alias.lower()] = value
    return tuple(pairs.items())


def parse_voice_aliases(text: str) -> tuple[tuple[str, str], ...]:
    """``"alloy=vivian, echo=voice-0123"`` -> ``(("alloy", "vivian"), ("echo", "voice-0123"))``:
    comma-separated ``ALIAS=VOICE`` pairs; an alias is matched case-insensitively (stored
    lower-cased) and may appear once."""
    return _parse_aliases(text, "voice", "VOICE")


def parse_model_aliases(text: str) -> tuple[tuple[str, str], ...]:
    """``"tts-1=base-0b6, tts-1-hd=base-1b7"``: comma-separated ``ALIAS=MODEL`` pairs (as
    :func:`parse_voice_aliases`), for clients that send a fixed model name."""
    return _parse_aliases(text, "model", "MODEL")


_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
"""A served model name: what a URL path segment and a log field can hold unquoted."""


@dataclass(frozen=True)
class ModelRoute:
    """Where one served model's stages are (an entry of ``--models``)."""

    name: str
    """The name requests choose it by (``SynthesizeRequest.model``, HTTP ``model``)."""
    talker_targets: tuple[str, ...]
    """Its talker replicas (same syntax as ``--talker-targets``)."""
    speaker_targets: tuple[str, ...] = ()
    """Its speaker stage (Base models; none: no cloning from new reference audio)."""


def check_model_name(name: str) -> str:
    """A valid served model name (letters, digits, ``.``, ``_``, ``-``; at most 128), else
    ArgumentTypeError."""
    if not _MODEL_NAME.match(name):
        raise argparse.ArgumentTypeError(
            f"model name {name!r}: use letters, digits, '.', '_' and '-' (at most 128, not starting with "
            "'.', '_' or '-')"
        )
    return name


def parse_model_routes(text: str) -> tuple[ModelRoute, ...]:
    """``"design: talker=a:1; base: talker=b:1,b:2 speaker=c:1"`` -> one :class:`ModelRoute` per
    ``;``-separated entry: ``NAME: talker=TARGETS [speaker=TARGETS]`` (targets comma-separated
    as in ``--talker-targets``). Names are unique."""
    routes: dict[str, ModelRoute] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        name, sep, rest = (part.strip() for part in entry.partition(":"))
        if not sep or not name:
            raise argparse.ArgumentTypeError(
                f"model {entry!r} is not 'NAME: talker=TARGETS [speaker=TARGETS]'"
            )
        check_model_name(name)
        if name in routes:
            raise argparse.ArgumentTypeError(f"model {name!r} is given twice")
        stages: dict[str, tuple[str, ...]] = {}
        for item in rest.split():
            key, sep, value = item.partition("=")
            if not sep or key not in ("talker", "speaker") or key in stages or not comma_list(value):
                raise argparse.ArgumentTypeError(
                    f"model {name!r}: {item!r} is not talker=TARGETS or speaker=TARGETS (each once)"
                )
            stages[key] = comma_list(value)
        if "talker" not in stages:
            raise argparse.ArgumentTypeError(f"model {name!r} has no talker=TARGETS")
        routes[name] = ModelRoute(name, stages["talker"], stages.get("speaker", ()))
    return tuple(routes.values())


def format_model_routes(routes: Sequence[ModelRoute]) -> str:
    """The ``--models`` value of ``routes`` (inverse of :func:`parse_model_routes`)."""
    entries = []
    for route in routes:
        entry = f"{route.name}: talker={','.join(route.talker_targets)}"
        if route.speaker_targets:
            entry += f" speaker={','.join(route.speaker_targets)}"
        entries.append(entry)
    return "; ".join(entries)


@dataclass(frozen=True)
class FailoverPolicy:
    """How far one stream goes to survive replica losses (``GatewayConfig.failover_*``)."""

    attempts: int = 3
    """Replacement calls per stage per stream (0 disables failover)."""
    wait_seconds: float = 3.0
    """How long one failover waits for a healthy replica."""
    max_frames: int = 4096
    """Frames kept per stream for replay; longer streams stop being failed over."""

    @classmethod
    def from_config(cls, config: GatewayConfig) -> FailoverPolicy:
        """The policy of a gateway configuration."""
        return cls(
            attempts=config.failover_attempts,
            wait_seconds=config.failover_wait_seconds,
            max_frames=config.failover_max_frames,
        )


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway servicer needs besides the generic server settings."""

    talker_targets: tuple[str, ...] = ()
    """Talker stage addresses of the one served model (unless ``--models`` lists several; one of
    the two is required): several ``host:port`` (round-robin / least-loaded in Python) or one
    gRPC target URI such as ``dns:///talker:50052`` (resolved by gRPC, round_robin). The model's
    name is the one its talker reports (its checkpoint directory's)."""

    decoder_targets: tuple[str, ...] = ()
    """Decoder stage addresses (required; same syntax as the talker's): one pool for every served
    model (their speech tokenizers must match, checked at startup)."""

    speaker_targets: tuple[str, ...] = ()
    """Speaker stage addresses of the one served model (with ``--talker-targets``); empty
    disables voice cloning from new reference audio (inline ``clone`` and RegisterVoice fail with
    FAILED_PRECONDITION; stored voices still work)."""

    aligner_targets: tuple[str, ...] = ()
    """Aligner stage addresses (same syntax as the decoder's): one pool for every served model,
    which times the words of the audio of requests asking for ``timestamps``; empty: a request
    asking for them fails with FAILED_PRECONDITION."""

    models: tuple[ModelRoute, ...] = field(default=(), metadata=flag(parse=parse_model_routes))
    """Several models behind this gateway, each by name with its own talker replicas and (Base
    models) speaker stage: ``NAME: talker=TARGETS [speaker=TARGETS]; NAME2: ...`` (e.g.
    ``design: talker=talker-design:50052; base: talker=talker-base:50052
    speaker=speaker-base:50054``). Requests choose one with ``model``; instead of
    ``--talker-targets`` / ``--speaker-targets``."""

    default_model: str = ""
    """The model of requests that name none (a name of ``--models``); unset: the first listed."""

    model_alias: tuple[tuple[str, str], ...] = field(default=(), metadata=flag(parse=parse_model_aliases))
    """More names for served models, for clients that send a fixed one (e.g. OpenAI's
    ``tts-1``): ``ALIAS=MODEL`` pairs, e.g. ``tts-1=base,tts-1-hd=base-1b7``."""

    max_concurrent_streams: int = field(default=64, metadata=_POSITIVE_INT)
    """Synthesize streams served at once; further ones fail at once with RESOURCE_EXHAUSTED."""

    max_text_chars: int = field(default=RequestLimits.max_text_chars, metadata=_POSITIVE_INT)
    """Longest accepted ``text``, in characters (100,000: a long chapter). A text too long for one
    talker request is spoken as consecutive segments in one stream."""

    max_instruct_chars: int = field(default=RequestLimits.max_instruct_chars, metadata=_POSITIVE_INT)
    """Longest accepted ``instruct`` and voice-clone ``ref_text``, in characters (they are part of
    the prompt of every segment)."""

    max_ref_audio_seconds: float = field(default=60.0, metadata=_POSITIVE_FLOAT)
    """Longest accepted reference recording (voice cloning), seconds."""

    max_ref_audio_bytes: int = field(default=32 * 1024 * 1024, metadata=_POSITIVE_INT)
    """Largest accepted reference audio upload, bytes."""

    voices_db: str | None = None
    """Where the voice library lives (registered voices, shared by every gateway over it):
    ``postgresql://USER:PASSWORD@HOST:5432/DB`` (libpq options such as ``?sslmode=require``
    understood; gateways on several hosts), or SQLite: ``sqlite:////abs/path.db`` or a path (one
    file; gateways on one host). Unset: ``voices.db`` in ``--voices-dir``; without that either, a
    temporary SQLite file deleted at exit (registered voices do not survive a restart)."""

    voices_db_schema: str = "public"
    """PostgreSQL schema of the voice library's tables (created if missing); several
    deployments can share one database in schemas of their own."""

    voices_db_timeout: float = field(default=5.0, metadata=_POSITIVE_FLOAT)
    """Limit of every voice-library operation in seconds (waiting for a connection or a lock
    included): a database that is down, locked or slower answers UNAVAILABLE with a retry hint
    instead of hanging; synthesis with preset speakers never waits for it."""

    voices_dir: str | None = None
    """Legacy voices directory (one JSON file per voice, as gateways before the voice library
    kept them): its voices are imported into the library once, at start (recorded: later starts
    skip it; with API keys they belong to no key, so admin keys see them); the default
    ``--voices-db`` lives in it."""

    max_voices: int = field(default=1000, metadata=_POSITIVE_INT)
    """Most registered voices in the library, every API key's together; RegisterVoice and
    ImportVoice beyond it fail with RESOURCE_EXHAUSTED."""

    max_voices_per_key: int = field(default=0, metadata=_NON_NEGATIVE_INT)
    """Most registered voices one API key may own (0: no limit of its own, ``--max-voices``
    only); beyond it RESOURCE_EXHAUSTED."""

    api_keys: frozenset[str] = frozenset()
    """Accepted API keys (with those of ``--api-keys-file`` and ``--voices-admin-keys``); none
    disables authentication."""

    voices_admin_keys: frozenset[str] = frozenset()
    """API keys that see, use, update, export and delete every key's registered voices (other
    keys only their own); they are accepted API keys too."""

    voices_owner_secret: str | None = field(default=None, metadata=flag(stage_env_only=True))
    """Secret (at least 16 characters; ``openssl rand -hex 32``) of the keyed digest (HMAC-SHA256)
    by which the voice library knows the API key owning a voice (never the key itself); set it
    with QWEN3TTS_GATEWAY_VOICES_OWNER_SECRET rather than on the command line. Unset: a random
    secret generated once into the database. Keep it stable: another one orphans every owner's
    voices."""

    tls_cert: str | None = None
    """PEM certificate chain for TLS on the public port (with ``tls_key``); unset = plaintext."""

    tls_key: str | None = None
    """PEM private key matching ``tls_cert``."""

    tls_client_ca: str | None = None
    """PEM CA bundle; when set, clients must present a certificate signed by it (mutual TLS)."""

    default_first_chunk_frames: int = field(default=DEFAULT_FIRST_CHUNK_FRAMES, metadata=_POSITIVE_INT)
    """Frames in the first audio chunk when the request leaves it 0 (160 ms); at most
    ``MAX_CHUNK_FRAMES``."""

    default_max_chunk_frames: int = field(default=DEFAULT_MAX_CHUNK_FRAMES, metadata=_POSITIVE_INT)
    """Largest audio chunk in frames when the request leaves it 0 (2 s); at most
    ``MAX_CHUNK_FRAMES``."""

    stage_timeout_seconds: float = field(default=30.0, metadata=_POSITIVE_FLOAT)
    """Deadline of unary stage calls (GetModelInfo, EmbedReference), and how long the decoder
    may stay silent after it got the last frame."""

    startup_timeout_seconds: float = field(default=0.0, metadata=flag(parse=non_negative_float))
    """How long startup waits for the talker's model info; 0 = until it comes (or a signal)."""

    model_info_ttl_seconds: float = field(default=60.0, metadata=_POSITIVE_FLOAT)
    """Cached talker model info is re-fetched when older than this (and after talker failures);
    if the refresh fails the cached copy keeps being used."""

    http_port: int = field(default=DEFAULT_HTTP_PORT, metadata=flag(parse=port_number, stage_env_only=True))
    """Port of the OpenAI-compatible HTTP API and the browser playground (same process and event
    loop as the gRPC server, same API keys, limits and metrics); 0 disables it."""

    http_host: str | None = None
    """Bind address of the HTTP API; unset: the gRPC ``--host`` ("[::]" = every interface, IPv4
    included)."""

    http_max_body_bytes: int = field(default=1024 * 1024, metadata=_POSITIVE_INT)
    """Largest HTTP request body (JSON requests) in bytes, else 413; a voice upload
    (``POST /v1/audio/voices``) may be ``max_ref_audio_bytes`` larger."""

    http_max_header_bytes: int = field(default=16 * 1024, metadata=_POSITIVE_INT)
    """Largest request head (request line and headers) of an HTTP request, in bytes, else 431
    (common proxies' default)."""

    http_max_headers: int = field(default=100, metadata=_POSITIVE_INT)
    """Most header fields in an HTTP request, else 431 (common proxies' default)."""

    websocket_config_timeout_seconds: float = field(default=10.0, metadata=_POSITIVE_FLOAT)
    """How long a WebSocket connection may stay open without sending its ``config`` message (and
    so without authenticating, where it brings its key there): then it is closed with 1008."""

    voice_alias: tuple[tuple[str, str], ...] = field(default=(), metadata=flag(parse=parse_voice_aliases))
    """HTTP ``voice`` aliases for clients that only offer OpenAI's voice names: ``ALIAS=VOICE``
    pairs (e.g. ``alloy=vivian,echo=voice-0123``), VOICE a preset speaker or a registered
    voice id."""

    health_check_interval_seconds: float = field(default=1.0, metadata=_POSITIVE_FLOAT)
    """How often the gateway checks each stage replica (``grpc.health.v1`` Check of the stage's
    service). A replica that fails a check gets no new streams and is no failover target until
    a check passes; the gateway's readiness is NOT_SERVING while no talker or no decoder replica
    passes."""

    health_check_timeout_seconds: float = field(default=2.0, metadata=_POSITIVE_FLOAT)
    """Deadline of one health check; a replica that does not answer in time fails it."""

    keepalive_seconds: float = field(default=2.0, metadata=flag(parse=non_negative_float))
    """Interval of HTTP/2 keepalive pings on the stage channels; with
    ``keepalive_timeout_seconds`` it bounds how long a hung or partitioned replica (one that
    stopped answering without closing its connections) goes unnoticed. 0 = no pings."""

    keepalive_timeout_seconds: float = field(default=2.0, metadata=_POSITIVE_FLOAT)
    """A stage connection whose keepalive ping is not answered within this fails, with every
    call on it (those streams then fail over)."""

    failover_attempts: int = field(default=FailoverPolicy.attempts, metadata=_NON_NEGATIVE_INT)
    """Replacement replicas one stream may use per stage after connection-level failures (the
    decoder's stream is replayed, the talker's regenerated with the same seed and checked, a
    speaker call retried); 0 disables failover: the stream ends with UNAVAILABLE."""

    failover_wait_seconds: float = field(
        default=FailoverPolicy.wait_seconds, metadata=flag(parse=non_negative_float)
    )
    """How long one failover waits for a healthy replica of the stage to become available
    before the stream ends with UNAVAILABLE naming the stage."""

    failover_max_frames: int = field(default=FailoverPolicy.max_frames, metadata=_NON_NEGATIVE_INT)
    """Codec frames kept per stream for failover (16 small integers per 80 ms frame; 4096 frames
    = 5.5 min of audio, 128 KiB); a stream past it is no longer failed over."""
    segment_tokens: int = field(default=0, metadata=_NON_NEGATIVE_INT)
    """Largest segment of a long text, in text tokens (the talker's tokenizer counts them); 0 =
    the largest whose runaway-guard frame budget fits a talker slot beside its prompt (173 tokens
    with 2048-position slots and no instruct or reference: no segment is ever cut short by the
    slot; tts_common.synthesis.segments). Larger values are capped to that. Smaller segments
    bring each segment's first audio sooner but more prosody breaks."""

    text_idle_timeout_seconds: float = field(default=30.0, metadata=_POSITIVE_FLOAT)
    """StreamingSynthesize: a stream whose text is still open ends with DEADLINE_EXCEEDED (its
    talker slot freed) after this long without a client message and without audio sent."""

    segment_lookahead: int = field(default=1, metadata=_NON_NEGATIVE_INT)
    """Segments of a long text generated ahead of the one being streamed: the next segment takes a
    talker slot as soon as the current one has produced audio, so it is ready when the current one
    ends (no gap). 0: one segment at a time (a gap of one segment's time to first audio at every
    cut)."""

    silence_stop: bool = field(default=True, metadata=flag(name="--no-silence-stop", negate=True))
    """The silence stop: end an utterance whose audio, after speech, stays below
    ``silence_threshold_dbfs`` for ``silence_stop_seconds`` (finish reason SILENCE, counted in
    qwen3tts_utterances_total); a request's ``silence_stop`` field overrides it."""

    silence_threshold_dbfs: float = field(default=SilenceStop.threshold_dbfs, metadata=flag(parse=dbfs_level))
    """Level (RMS of one 80 ms codec frame, dB relative to full scale) below which audio counts
    as silence for the silence stop."""

    silence_stop_seconds: float = field(default=SilenceStop.seconds, metadata=_POSITIVE_FLOAT)
    """Silence after speech, in seconds, that ends an utterance (silence stop); longer than any
    natural pause."""

    channel_options: tuple[tuple[str, Any], ...] = field(default=(), metadata=NOT_A_FLAG)
    """Extra gRPC channel options for the stage channels (tests, tuning)."""

    def __post_init__(self) -> None:
        # Admin keys are accepted keys: one set decides whether a key may call at all.
        if not self.voices_admin_keys <= self.api_keys:
            object.__setattr__(self, "api_keys", self.api_keys | self.voices_admin_keys)

    def voice_library(self) -> VoiceLibraryConfig:
        """The voice library's settings (ValueError when one is out of range)."""
        secret = self.voices_owner_secret
        return VoiceLibraryConfig(
            max_voices=self.max_voices,
            max_voices_per_owner=self.max_voices_per_key or None,
            timeout_s=self.voices_db_timeout,
            owner_secret=None if secret is None else secret.encode("utf-8"),
            postgres_schema=self.voices_db_schema,
        )


@dataclass(frozen=True)
class ApiKeysFileConfig:
    """The one gateway flag that is not a :class:`GatewayConfig` field: its keys are merged
    into ``GatewayConfig.api_keys``."""

    api_keys_file: str | None = None
    """File with one API key per line (blank lines and # comments ignored); its keys are
    accepted besides ``--api-keys``. It must hold at least one."""


FLAGS = ProcessFlags(
    stage=STAGE,
    default_port=DEFAULT_PORT,
    groups=(("gateway", GatewayConfig), ("gateway", ApiKeysFileConfig)),
    description="qwen3-tts gateway: public TextToSpeech API over the talker, decoder and speaker stages",
    prog="python -m gateway",
)
"""The gateway process's command line."""


def read_api_keys_file(path: str) -> frozenset[str]:
    """API keys from a file: one per line; blank lines and ``#`` comments are ignored."""
    with open(path, encoding="utf-8") as fh:
        return frozenset(k for line in fh if (k := line.split("#", 1)[0].strip()))


def gateway_config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Build and check the :class:`GatewayConfig` of a namespace parsed by :data:`FLAGS`;
    ValueError with a usage message if the flags are inconsistent (missing targets, half a TLS
    pair, unreadable key file, ...). Chunk defaults are capped at
    :data:`MAX_CHUNK_FRAMES`."""
    config = config_from_args(GatewayConfig, args)
    key_file = config_from_args(ApiKeysFileConfig, args).api_keys_file
    if not config.talker_targets and not config.models:
        raise ValueError(
            "--talker-targets or --models (or QWEN3TTS_TALKER_TARGETS / QWEN3TTS_MODELS) is required"
        )
    if config.models and (config.talker_targets or config.speaker_targets):
        raise ValueError(
            "--models names every model's stages: give it without --talker-targets/--speaker-targets"
        )
    names = [m.name for m in config.models]
    if config.default_model and config.default_model not in names:
        raise ValueError(
            f"--default-model {config.default_model!r} is not one of --models ({', '.join(names) or 'none'})"
        )
    for alias, target in config.model_alias:
        if names and target not in names:
            raise ValueError(
                f"--model-alias {alias}={target}: no model {target!r} (--models: {', '.join(names)})"
            )
        if alias in (n.lower() for n in names):
            raise ValueError(f"--model-alias {alias!r} is already a model name")
    if not config.decoder_targets:
        raise ValueError("--decoder-targets (or QWEN3TTS_DECODER_TARGETS) is required")
    keys = set(config.api_keys)
    if key_file:
        try:
            keys |= read_api_keys_file(key_file)
        except OSError as exc:
            raise ValueError(f"cannot read --api-keys-file {key_file}: {exc}") from exc
        if not keys:
            raise ValueError(f"--api-keys-file {key_file} holds no keys")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ValueError("--tls-cert and --tls-key must be given together")
    if config.tls_client_ca and not config.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert/--tls-key")
    for path in (config.tls_cert, config.tls_key, config.tls_client_ca):
        if path and not os.path.isfile(path):
            raise ValueError(f"TLS file not found: {path}")
    try:
        config.voice_library()
    except ValueError as exc:
        raise ValueError(
            f"voice library settings (--voices-db-schema, --voices-owner-secret): {exc}"
        ) from None
    return dataclasses.replace(
        config,
        api_keys=frozenset(keys),
        default_first_chunk_frames=min(config.default_first_chunk_frames, MAX_CHUNK_FRAMES),
        default_max_chunk_frames=min(config.default_max_chunk_frames, MAX_CHUNK_FRAMES),
    )


__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_PORT",
    "FLAGS",
    "STAGE",
    "ApiKeysFileConfig",
    "FailoverPolicy",
    "GatewayConfig",
    "ModelRoute",
    "check_model_name",
    "format_model_routes",
    "gateway_config_from_args",
    "parse_model_aliases",
    "parse_model_routes",
    "parse_voice_aliases",
    "port_number",
    "read_api_keys_file",
]
