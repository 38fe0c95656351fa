"""Gateway settings: the :class:`GatewayConfig` dataclass and its command-line flags.

Every flag can also come from the environment, most specific first:
``QWEN3TTS_GATEWAY_<FIELD>`` then ``QWEN3TTS_<FIELD>`` (e.g. ``--talker-targets`` ←
``QWEN3TTS_GATEWAY_TALKER_TARGETS`` / ``QWEN3TTS_TALKER_TARGETS``). Command-line flags win.
The standard server flags (host, port, metrics, message sizes, grace, log level) come from
:func:`tts_common.serving.parse_server_args`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tts_common.serving import env_names, env_value

STAGE = "gateway"
DEFAULT_PORT = 50051
MAX_CHUNK_FRAMES_LIMIT = 100
"""Largest accepted StreamingOptions.first_chunk_frames / max_chunk_frames (8 s of audio)."""


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway servicer needs besides the generic server settings."""

    talker_targets: tuple[str, ...] = ()
    """Talker stage addresses: several ``host:port`` (round-robin / least-loaded in Python) or
    one gRPC target URI such as ``dns:///talker:50052`` (resolved by gRPC, round_robin)."""

    decoder_targets: tuple[str, ...] = ()
    """Decoder stage addresses (same syntax as ``talker_targets``)."""

    speaker_targets: tuple[str, ...] = ()
    """Speaker stage addresses; empty disables voice cloning from new reference audio (inline
    ``clone`` and RegisterVoice fail with FAILED_PRECONDITION; stored voices still work)."""

    max_concurrent_streams: int = 64
    """Synthesize streams served at once; further ones fail at once with RESOURCE_EXHAUSTED."""

    max_text_chars: int = 2000
    """Longest accepted ``text`` (and ``instruct`` / ``ref_text``), in characters."""

    max_ref_audio_seconds: float = 60.0
    """Longest accepted reference recording (voice cloning), seconds."""

    max_ref_audio_bytes: int = 32 * 1024 * 1024
    """Largest accepted reference audio upload, bytes."""

    voices_dir: str | None = None
    """Directory persisting registered voices (one JSON file each); None keeps them in memory
    only (lost on restart)."""

    max_voices: int = 1000
    """Most registered voices; RegisterVoice beyond it fails with RESOURCE_EXHAUSTED."""

    api_keys: frozenset[str] = frozenset()
    """Accepted API keys; empty disables authentication."""

    tls_cert: str | None = None
    """PEM certificate chain for TLS on the public port (with ``tls_key``); None = plaintext."""

    tls_key: str | None = None
    """PEM private key matching ``tls_cert``."""

    tls_client_ca: str | None = None
    """PEM CA bundle; when set, clients must present a certificate signed by it (mutual TLS)."""

    default_first_chunk_frames: int = 2
    """Frames in the first audio chunk when the request leaves it 0 (160 ms)."""

    default_max_chunk_frames: int = 25
    """Largest audio chunk in frames when the request leaves it 0 (2 s)."""

    stage_timeout_seconds: float = 30.0
    """Deadline of unary stage calls (GetModelInfo, EmbedReference), and how long the decoder
    may stay silent after it got the last frame."""

    startup_timeout_seconds: float = 0.0
    """How long startup waits for the talker's model info; 0 = until it comes (or a signal)."""

    model_info_ttl_seconds: float = 60.0
    """Cached talker model info is re-fetched when older than this (and after talker failures);
    if the refresh fails the cached copy keeps being used."""

    channel_options: tuple[tuple[str, Any], ...] = field(default=())
    """Extra gRPC channel options for the stage channels (tests, tuning)."""


def parse_targets(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Split a comma-separated target list (``"a:1, b:2"``), dropping blanks."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(t.strip() for t in items if t and t.strip())


def read_api_keys_file(path: str) -> frozenset[str]:
    """API keys from a file: one per line; blank lines and ``#`` comments are ignored."""
    with open(path, encoding="utf-8") as fh:
        return frozenset(k for line in fh if (k := line.split("#", 1)[0].strip()))


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# (dest, flag, type, default, help)
_FLAGS: tuple[tuple[str, str, Callable[[str], Any], Any, str], ...] = (
    (
        "talker_targets",
        "--talker-targets",
        str,
        "",
        "talker stage: comma-separated host:port list or one dns:///name:port target",
    ),
    (
        "decoder_targets",
        "--decoder-targets",
        str,
        "",
        "decoder stage: comma-separated host:port list or one dns:///name:port target",
    ),
    (
        "speaker_targets",
        "--speaker-targets",
        str,
        "",
        "speaker stage (optional; without it voice cloning from new audio is unavailable)",
    ),
    (
        "max_concurrent_streams",
        "--max-concurrent-streams",
        _positive_int,
        64,
        "Synthesize streams served at once (more: RESOURCE_EXHAUSTED)",
    ),
    ("max_text_chars", "--max-text-chars", _positive_int, 2000, "longest accepted text"),
    (
        "max_ref_audio_seconds",
        "--max-ref-audio-seconds",
        _positive_float,
        60.0,
        "longest accepted reference audio, seconds",
    ),
    (
        "max_ref_audio_bytes",
        "--max-ref-audio-bytes",
        _positive_int,
        32 * 1024 * 1024,
        "largest accepted reference audio upload, bytes",
    ),
    (
        "voices_dir",
        "--voices-dir",
        str,
        "",
        "directory persisting registered voices (default: in memory only)",
    ),
    ("max_voices", "--max-voices", _positive_int, 1000, "most registered voices"),
    (
        "api_keys",
        "--api-keys",
        str,
        "",
        "comma-separated API keys; when set (or --api-keys-file), RPCs need one",
    ),
    ("api_keys_file", "--api-keys-file", str, "", "file with one API key per line"),
    ("tls_cert", "--tls-cert", str, "", "PEM certificate chain: serve TLS on the public port"),
    ("tls_key", "--tls-key", str, "", "PEM private key for --tls-cert"),
    (
        "tls_client_ca",
        "--tls-client-ca",
        str,
        "",
        "PEM CA bundle: require client certificates signed by it (mutual TLS)",
    ),
    (
        "default_first_chunk_frames",
        "--default-first-chunk-frames",
        _positive_int,
        2,
        "frames in the first audio chunk unless the request says otherwise",
    ),
    (
        "default_max_chunk_frames",
        "--default-max-chunk-frames",
        _positive_int,
        25,
        "largest audio chunk in frames unless the request says otherwise",
    ),
    (
        "stage_timeout_seconds",
        "--stage-timeout-seconds",
        _positive_float,
        30.0,
        "deadline of unary stage calls (model info, reference embedding) and of the decoder's final flush",
    ),
    (
        "startup_timeout_seconds",
        "--startup-timeout-seconds",
        _non_negative_float,
        0.0,
        "how long startup waits for the talker (0 = forever)",
    ),
    (
        "model_info_ttl_seconds",
        "--model-info-ttl-seconds",
        _positive_float,
        60.0,
        "refresh the cached talker model info when older than this",
    ),
)


def add_gateway_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Add the gateway's own flags (defaults from the environment, see the module doc)."""
    environ = os.environ if env is None else env
    group = parser.add_argument_group("gateway")
    for dest, flag, type_, default, help_text in _FLAGS:
        names = env_names(STAGE, dest)
        group.add_argument(
            flag,
            dest=dest,
            type=type_,
            default=env_value(names, environ, default),
            help=f"{help_text} (env {' / '.join(names)}; default %(default)s)",
        )


def gateway_config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Build and check the :class:`GatewayConfig`; ValueError with a usage message if the flags
    are inconsistent (missing targets, half a TLS pair, unreadable key file, ...)."""
    talker = parse_targets(args.talker_targets)
    decoder = parse_targets(args.decoder_targets)
    if not talker:
        raise ValueError("--talker-targets (or QWEN3TTS_TALKER_TARGETS) is required")
    if not decoder:
        raise ValueError("--decoder-targets (or QWEN3TTS_DECODER_TARGETS) is required")
    keys = set(parse_targets(args.api_keys))
    if args.api_keys_file:
        try:
            keys |= read_api_keys_file(args.api_keys_file)
        except OSError as exc:
            raise ValueError(f"cannot read --api-keys-file {args.api_keys_file}: {exc}") from exc
        if not keys:
            raise ValueError(f"--api-keys-file {args.api_keys_file} holds no keys")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key must be given together")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert/--tls-key")
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca):
        if path and not os.path.isfile(path):
            raise ValueError(f"TLS file not found: {path}")
    return GatewayConfig(
        talker_targets=talker,
        decoder_targets=decoder,
        speaker_targets=parse_targets(args.speaker_targets),
        max_concurrent_streams=args.max_concurrent_streams,
        max_text_chars=args.max_text_chars,
        max_ref_audio_seconds=args.max_ref_audio_seconds,
        max_ref_audio_bytes=args.max_ref_audio_bytes,
        voices_dir=args.voices_dir or None,
        max_voices=args.max_voices,
        api_keys=frozenset(keys),
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
        tls_client_ca=args.tls_client_ca or None,
        default_first_chunk_frames=min(args.default_first_chunk_frames, MAX_CHUNK_FRAMES_LIMIT),
        default_max_chunk_frames=min(args.default_max_chunk_frames, MAX_CHUNK_FRAMES_LIMIT),
        stage_timeout_seconds=args.stage_timeout_seconds,
        startup_timeout_seconds=args.startup_timeout_seconds,
        model_info_ttl_seconds=args.model_info_ttl_seconds,
    )


__all__ = [
    "DEFAULT_PORT",
    "GatewayConfig",
    "MAX_CHUNK_FRAMES_LIMIT",
    "STAGE",
    "add_gateway_arguments",
    "gateway_config_from_args",
    "parse_targets",
    "read_api_keys_file",
]
