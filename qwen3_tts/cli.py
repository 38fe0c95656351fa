"""The ``qwen3-tts`` command.

synthesize      offline synthesis with the reference pipeline (one text or a JSONL file)
make-dev-model  write a small random checkpoint in the official layout
up              run the stage processes locally (dev checkpoints when no --model / --aligner-model)
say             call Synthesize (or, --stream-text, StreamingSynthesize with stdin) on a running gateway; write a WAV
health          exit 0 iff servers report SERVING: gRPC health, or HTTP /health (container probes)
doctor          check a host before serving: environment, every graph bucket against eager, step times, memory
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy modules are imported by the commands that use them
    import ssl

    import grpc

    from .offline import OfflineResult


def _add_synthesize(sub: argparse._SubParsersAction) -> None:
    from tts_common.precision import DTYPE_CHOICES

    p = sub.add_parser("synthesize", help="offline synthesis (reference pipeline)")
    p.add_argument("--model", required=True, help="checkpoint directory (official layout)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text")
    src.add_argument(
        "--text-file", type=Path, help="UTF-8 file with the text (a long text is spoken in segments)"
    )
    src.add_argument("--requests", type=Path, help="JSONL file, one request per line (fixture format)")
    p.add_argument("--speaker")
    p.add_argument("--language", default="auto")
    p.add_argument("--instruct")
    p.add_argument("--ref-audio", type=Path)
    p.add_argument("--ref-text")
    p.add_argument("--x-vector-only", action="store_true")
    feed = p.add_mutually_exclusive_group()
    feed.add_argument("--non-streaming-text", dest="non_streaming_text", action="store_const", const=True)
    feed.add_argument("--streaming-text", dest="non_streaming_text", action="store_const", const=False)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="greedy talker and code predictor")
    mode.add_argument("--seed", type=int, help="sampling seed (checkpoint sampling defaults)")
    p.add_argument(
        "--max-new-tokens", type=int, help="official meaning: M gives at most M-1 frames (per segment)"
    )
    p.add_argument(
        "--segment-tokens",
        type=int,
        default=0,
        help="largest segment of a long text in text tokens (default 0: what fits the talker's default "
        "slot, as the gateway cuts it)",
    )
    p.add_argument(
        "--no-silence-stop",
        action="store_true",
        help="keep audio that stays silent after speech (default: end a segment after 2 s of it, as the gateway)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="auto = bfloat16 where it is faster (CUDA with bf16; on CPU, by measuring), else float32 "
        "(default float32: parity with the official implementation)",
    )
    p.add_argument("--out", type=Path, help="output WAV (with --text / --text-file)")
    p.add_argument("--codes-out", type=Path, help="codes .npy [frames, 16] (with --text / --text-file)")
    p.add_argument("--out-dir", type=Path, help="output folder (with --requests): ID.wav, ID.codes.npy")
    p.add_argument(
        "--timestamps",
        type=Path,
        metavar="FILE.json",
        help="also write when each word is heard (with --text / --text-file): the aligner runs in this "
        "process on every segment's audio",
    )
    p.add_argument("--timestamp-unit", default="word", choices=["word", "character"])
    p.add_argument(
        "--aligner-model",
        type=Path,
        metavar="DIR",
        help="Qwen3-ForcedAligner checkpoint for --timestamps (default: the dev aligner checkpoint, random "
        "weights, created in .dev-model/ on first use, as `qwen3-tts up` does)",
    )
    p.set_defaults(func=cmd_synthesize)


def cmd_synthesize(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf

    from tts_common.pb.qwen3tts.v1 import tts_pb2
    from tts_common.silence import DEFAULT_SILENCE_STOP

    from .offline import OfflineRequest, OfflineSynthesizer, read_requests

    if args.requests is not None:
        if args.out_dir is None:
            raise ValueError("--requests needs --out-dir")
        if args.timestamps is not None:
            raise ValueError("--timestamps needs --text or --text-file")
        requests = read_requests(args.requests)
    else:
        if args.out is None:
            raise ValueError("--text and --text-file need --out")
        if args.ref_text and args.ref_audio is None:
            raise ValueError("--ref-text needs --ref-audio")
        text = args.text if args.text_file is None else args.text_file.read_text(encoding="utf-8")
        requests = [
            OfflineRequest(
                id="out",
                text=text,
                language=args.language,
                speaker=args.speaker,
                instruct=args.instruct,
                non_streaming_text=args.non_streaming_text,
                ref_audio=args.ref_audio,
                ref_text=args.ref_text,
                x_vector_only=args.x_vector_only,
            )
        ]
    sampling = tts_pb2.SamplingOptions()
    if args.greedy:
        sampling.do_sample = sampling.subtalker_do_sample = False
    if args.seed is not None:
        sampling.seed = args.seed
    if args.max_new_tokens is not None:
        sampling.max_new_tokens = args.max_new_tokens
    if args.segment_tokens < 0:
        raise ValueError(f"--segment-tokens must be >= 0, got {args.segment_tokens}")
    from decoder_service.model.dtype_probe import checkpoint_decoder_probe
    from speaker_service.model.dtype_probe import checkpoint_speaker_probe
    from talker_service.engine.dtype_probe import checkpoint_talker_probe

    synth = OfflineSynthesizer(
        args.model,
        args.device,
        _stage_dtype(args, args.model, checkpoint_talker_probe),
        decoder_dtype=_stage_dtype(args, args.model, checkpoint_decoder_probe),
        speaker_dtype=_stage_dtype(args, args.model, checkpoint_speaker_probe),
    )
    results = synth.synthesize(
        requests,
        sampling,
        segment_tokens=args.segment_tokens,
        silence=None if args.no_silence_stop else DEFAULT_SILENCE_STOP,
    )
    if args.requests is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for req, res in zip(requests, results):
            sf.write(args.out_dir / f"{req.id}.wav", res.wav, synth.sample_rate, subtype="FLOAT")
            np.save(args.out_dir / f"{req.id}.codes.npy", res.codes)
            print(f"{req.id}: {_described(res, synth.sample_rate)}")
    else:
        res = results[0]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        sf.write(args.out, res.wav, synth.sample_rate, subtype="FLOAT")
        if args.codes_out is not None:
            np.save(args.codes_out, res.codes)
        print(f"{args.out}: {_described(res, synth.sample_rate)}")
        if args.timestamps is not None:
            _write_timestamps(args, requests[0], res, synth.sample_rate)
    return 0


def _stage_dtype(args: argparse.Namespace, model_dir: str | Path, probe: Callable[[str], Any]) -> Any:
    """``--dtype`` of one stage's model: ``auto`` on CPU timed on that stage's own step,
    ``probe(model_dir)``, as the stage processes resolve it (``tts_common.auto_dtype``)."""
    import functools

    import torch

    from tts_common.precision import resolve_dtype

    return getattr(torch, resolve_dtype(args.dtype, args.device, functools.partial(probe, str(model_dir))))


def _write_timestamps(
    args: argparse.Namespace, request: Any, result: OfflineResult, sample_rate: int
) -> None:
    """``--timestamps``: align every segment of ``result`` in this process, write the JSON."""

    from aligner_service.model.dtype_probe import checkpoint_aligner_probe

    from .offline_timestamps import OfflineAligner, align_result, timestamps_document, write_timestamps

    aligner_dir = args.aligner_model
    if aligner_dir is None:
        from .dev_aligner import make_dev_aligner
        from .local_stack import DEV_ALIGNER_SUBDIR

        aligner_dir = make_dev_aligner(Path(".dev-model") / DEV_ALIGNER_SUBDIR, if_missing=True)
    aligner = OfflineAligner(
        aligner_dir, args.device, _stage_dtype(args, aligner_dir, checkpoint_aligner_probe)
    )
    spans = align_result(aligner, result, request.text, sample_rate, request.language, args.timestamp_unit)
    duration = len(result.wav) / sample_rate
    write_timestamps(args.timestamps, timestamps_document(spans, request.text, duration, args.timestamp_unit))
    print(f"{args.timestamps}: {len(spans)} {args.timestamp_unit}s")


def _described(result: OfflineResult, sample_rate: int) -> str:
    """``"N frames, S s"``, with the segment count and any segment that did not end with EOS."""
    text = f"{result.codes.shape[0]} frames, {len(result.wav) / sample_rate:.2f} s"
    if len(result.segments) > 1:
        text += f", {len(result.segments)} segments"
    unusual = [
        f"segment {i}: {s.finish_reason}" for i, s in enumerate(result.segments) if s.finish_reason != "EOS"
    ]
    return text + (f" ({'; '.join(unusual)})" if unusual else "")


def _add_make_dev_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-dev-model", help="write a small random checkpoint in the official layout")
    p.add_argument("path", type=Path)
    p.add_argument("--type", default="custom_voice", choices=["custom_voice", "base", "voice_design"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--if-missing", action="store_true", help="keep an existing checkpoint at PATH")
    p.set_defaults(func=cmd_make_dev_model)


def cmd_make_dev_model(args: argparse.Namespace) -> int:
    from .dev_model import make_dev_model

    path = make_dev_model(args.path, args.type, args.seed, if_missing=args.if_missing)
    print(f"dev checkpoint ({args.type}) at {path}")
    return 0


def _add_up(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run gateway, talker, decoder, speaker and aligner locally")
    p.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]DIR",
        help="checkpoint directory, served as NAME (default: the directory's name); repeat it to serve "
        "several models behind one gateway and one decoder pool, the first the default (default: the dev "
        "checkpoint)",
    )
    p.add_argument(
        "--dev-model-dir",
        type=Path,
        default=Path(".dev-model"),
        help="where dev checkpoints live (one sub-folder per type, and the dev aligner's)",
    )
    p.add_argument(
        "--dev-model-type",
        default="voice_design",
        type=dev_model_types,
        help="dev checkpoint type(s), comma-separated: voice_design (no voice needed), custom_voice "
        "(preset speakers), base (voice cloning through the speaker stage); several (e.g. "
        "voice_design,base,custom_voice) are served by name behind one gateway, the first the default",
    )
    p.add_argument("--host", default="127.0.0.1", help="gateway bind address (stages always on loopback)")
    p.add_argument("--port", type=int, default=50051, help="gateway port")
    p.add_argument(
        "--http-port", type=int, default=8000, help="gateway HTTP API and playground port (0: off)"
    )
    p.add_argument(
        "--base-port",
        type=int,
        default=50052,
        help="first stage port: talker, decoder, speaker, then the extra replicas, the aligner last "
        "(one model, one replica: 50052..50055)",
    )
    p.add_argument("--device", default=None)
    p.add_argument(
        "--metrics",
        action="store_true",
        help="expose /metrics on 9091 (gateway) and 9092.. (the stages, in port order: 9092..9095 for "
        "one model and one replica)",
    )
    aligner = p.add_mutually_exclusive_group()
    aligner.add_argument(
        "--aligner-model",
        type=Path,
        metavar="DIR",
        help="Qwen3-ForcedAligner checkpoint directory for word timestamps (default: the dev aligner "
        "checkpoint, random weights, in --dev-model-dir)",
    )
    aligner.add_argument(
        "--no-aligner",
        action="store_true",
        help="run no aligner stage (requests asking for timestamps get FAILED_PRECONDITION)",
    )
    p.add_argument(
        "--voices-db",
        default=".qwen3-tts/voices.db",
        help="the gateway's voice library: a SQLite file (kept across runs) or postgresql://... (the "
        "gateway's --voices-db)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="talker and decoder processes each (>= 2: streams survive losing one; a replica that "
        "exits is restarted; extra ports after the speaker's)",
    )
    p.set_defaults(func=cmd_up)


def dev_model_types(text: str) -> str:
    """``--dev-model-type``: comma-separated dev checkpoint types, each once."""
    from .dev_model import MODEL_TYPES

    types = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in types if t not in MODEL_TYPES]
    if not types or unknown or len(set(types)) != len(types):
        raise argparse.ArgumentTypeError(
            f"expected distinct types among {', '.join(MODEL_TYPES)}, comma-separated; got {text!r}"
        )
    return ",".join(types)


def cmd_up(args: argparse.Namespace) -> int:
    from .local_stack import run_local_stack

    return run_local_stack(args)


def _add_say(sub: argparse._SubParsersAction) -> None:
    from .request_flags import add_request_flags

    p = sub.add_parser("say", help="synthesize through a running gateway into a WAV file")
    p.add_argument("text", nargs="?", default="", help="the text (not with --stream-text)")
    p.add_argument(
        "--stream-text",
        action="store_true",
        help="read the text from standard input and send it to StreamingSynthesize as it arrives "
        "(e.g. `llm ... | qwen3-tts say --stream-text`): speech starts after the first words",
    )
    p.add_argument("-o", "--out", type=Path, default=Path("out.wav"))
    p.add_argument(
        "--captions",
        type=captions_path,
        metavar="FILE.srt|FILE.vtt",
        help="ask for word timestamps and write them as captions (SubRip or WebVTT, from the extension)",
    )
    p.add_argument("--gateway", default="127.0.0.1:50051")
    add_request_flags(p)
    p.add_argument("--api-key")
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(func=cmd_say)


def captions_path(text: str) -> Path:
    """``--captions``: a path ending in .srt or .vtt."""
    from .captions import caption_format

    try:
        caption_format(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return Path(text)


def cmd_say(args: argparse.Namespace) -> int:
    from .client import say

    return say(args)


def _add_health(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("health", help="exit 0 iff every server reports SERVING")
    p.add_argument(
        "addresses",
        nargs="+",
        metavar="ADDRESS",
        help="HOST:PORT (gRPC health) or an http:// URL (200 = serving, e.g. the gateway's /health)",
    )
    p.add_argument("--service", default="", help="gRPC service name ('' = overall)")
    p.add_argument("--timeout", type=float, default=3.0)
    tls = p.add_argument_group(
        "TLS (for a server started with --tls-cert/--tls-key; an https:// URL always speaks TLS)"
    )
    tls.add_argument("--tls", action="store_true", help="speak TLS, trusting the system's root CAs")
    tls.add_argument("--tls-ca", metavar="FILE", help="speak TLS, trusting this CA (PEM; implies --tls)")
    tls.add_argument("--tls-cert", metavar="FILE", help="client certificate for mutual TLS (implies --tls)")
    tls.add_argument("--tls-key", metavar="FILE", help="key of --tls-cert")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name to verify the server certificate against (default: the host of ADDRESS)",
    )
    p.set_defaults(func=cmd_health)


def health_channel_credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS credentials for ``qwen3-tts health``'s gRPC addresses (None: plaintext); the PEM files
    are read here, once per command (:func:`cmd_health` has checked the client-certificate pair)."""
    import grpc

    if not (args.tls or args.tls_ca or args.tls_cert):
        return None

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as fh:
            return fh.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(args.tls_ca),
        private_key=read(args.tls_key),
        certificate_chain=read(args.tls_cert),
    )


def health_ssl_context(args: argparse.Namespace) -> ssl.SSLContext:
    """The TLS context of ``qwen3-tts health`` for an https:// URL: the system's root CAs or
    ``--tls-ca``, the ``--tls-cert``/``--tls-key`` client certificate, and the certificate checked
    against ``--tls-server-name`` when given (else the URL's host)."""
    import ssl

    server_name: str | None = args.tls_server_name

    class _Context(ssl.SSLContext):
        # http.client passes the URL's host as server_hostname; --tls-server-name replaces it
        # (SNI and certificate check), as ssl_target_name_override does for the gRPC channel.
        def wrap_socket(self, *a: Any, **kw: Any) -> ssl.SSLSocket:
            if server_name:
                kw["server_hostname"] = server_name
            return super().wrap_socket(*a, **kw)

    context = _Context(ssl.PROTOCOL_TLS_CLIENT)
    if args.tls_ca:
        context.load_verify_locations(cafile=args.tls_ca)
    else:
        context.load_default_certs()
    if args.tls_cert:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def cmd_health(args: argparse.Namespace) -> int:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key must be given together")
    is_http = [a.startswith(("http://", "https://")) for a in args.addresses]
    credentials = health_channel_credentials(args) if not all(is_http) else None
    context = health_ssl_context(args) if any(a.startswith("https://") for a in args.addresses) else None
    return max(
        _http_health(address, args, context if address.startswith("https://") else None)
        if http
        else _grpc_health(address, args, credentials)
        for http, address in zip(is_http, args.addresses)
    )


def _grpc_health(address: str, args: argparse.Namespace, credentials: grpc.ChannelCredentials | None) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        if credentials is None:
            channel = grpc.insecure_channel(address)
        else:
            options = (
                [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
            )
            channel = grpc.secure_channel(address, credentials, options=options)
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
    except grpc.RpcError as exc:
        print(f"{address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address} {args.service or '(overall)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _http_health(url: str, args: argparse.Namespace, context: ssl.SSLContext | None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=args.timeout, context=context) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    print(f"{url}: HTTP {status}")
    return 0 if status == 200 else 1


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    from tts_common.precision import DTYPE_CHOICES

    p = sub.add_parser(
        "doctor",
        help="check this host before serving: environment, graph buckets vs eager, step times, memory plan",
    )
    p.add_argument("--model", type=Path, help="checkpoint directory (default: a dev checkpoint, see --size)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        help="auto resolves as the stages do (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--size",
        choices=["dev", "0b6", "1b7"],
        help="dev checkpoint dims without --model (default: 1b7 on CUDA, dev on CPU)",
    )
    p.add_argument(
        "--max-slots", type=int, help="talker slots to plan and capture (default: 64 on CUDA, 4 on CPU)"
    )
    p.add_argument("--max-seq-len", type=int, default=2048, help="talker KV positions per slot")
    p.add_argument("--timed-steps", type=int, default=5, help="steps timed per talker bucket")
    p.add_argument(
        "--decoder-batch-buckets", type=_int_list, metavar="N,N,...", help="default: the decoder server's"
    )
    p.add_argument(
        "--decoder-frame-buckets", type=_int_list, metavar="N,N,...", help="default: the decoder server's"
    )
    p.add_argument(
        "--decoder-graph-memory",
        type=_size,
        metavar="SIZE",
        help="the decoder's --graph-memory bound, e.g. 4GiB (0: no bound; default: the decoder server's)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write the whole report as JSON")
    p.set_defaults(func=cmd_doctor)


def _size(text: str) -> int:
    from tts_common.memory import parse_size

    return parse_size(text)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def cmd_doctor(args: argparse.Namespace) -> int:
    import torch

    from .doctor import DoctorOptions, render, run_doctor, write_json

    options = DoctorOptions(
        model=args.model,
        device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        dtype=args.dtype,
        size=args.size,
        max_slots=args.max_slots,
        max_seq_len=args.max_seq_len,
        timed_steps=args.timed_steps,
        decoder_batch_buckets=args.decoder_batch_buckets,
        decoder_frame_buckets=args.decoder_frame_buckets,
        decoder_graph_memory=args.decoder_graph_memory,
    )
    report = run_doctor(options)
    print(render(report))
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3-tts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_synthesize, _add_make_dev_model, _add_up, _add_say, _add_health, _add_doctor):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from tts_common.errors import TTSError

    try:
        code = args.func(args)
    except (TTSError, ValueError, FileNotFoundError) as exc:
        print(f"qwen3-tts {args.command}: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
