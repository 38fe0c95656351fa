"""Every model a gateway serves, by name, and the one decoder pool they share:
:class:`ModelRegistry`.

A request names its model (``SynthesizeRequest.model``, HTTP ``model``): "" is the default
model, an alias (``--model-alias``) stands for a model, and any other name is NOT_FOUND with a
message listing the served ones (:meth:`ModelRegistry.get`, the one place a name is resolved).

One decoder pool decodes every model's frames: all released Qwen3-TTS checkpoints share the same
12 Hz speech tokenizer. Every talker model and every decoder replica report their speech
tokenizer's fingerprint (``TalkerInfo`` / ``DecoderInfo.speech_tokenizer``,
:mod:`tts_common.fingerprint`), and :meth:`ModelRegistry.start` checks them before the gateway
serves: talker models with different speech tokenizers, or a decoder replica reachable at
startup with another one, stop the gateway with an error naming the model and the decoder. A
decoder replica that is not up yet is checked when it first answers: a mismatch then is logged
as an error and keeps the gateway NOT_SERVING (dependency "decoder speech tokenizer") until it is
restarted with a matching pool (the gateway stays alive: liveness is not readiness). A stage that
reports no fingerprint (an older one) is not checked, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from tts_common.errors import FailedPreconditionError, NotFoundError
from tts_common.fingerprint import short_fingerprint
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.serving.health import ServingHealth
from tts_common.serving.names import service_name
from tts_common.serving.server import channel_options, keepalive_channel_options
from tts_common.synthesis.validation import RequestLimits

from ..config import FailoverPolicy, GatewayConfig, ModelRoute
from .aligner import AlignerStage
from .backend import ModelBackend
from .model_info import STARTUP_PROBE_TIMEOUT_S
from .routing import StageClient, tie_readiness
from .speaker import SpeakerStage

logger = logging.getLogger(__name__)

RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # A stage that starts after the gateway, or restarts, is used again within about a second:
    # gRPC's default backoff grows to 120 s, and while a channel backs off its calls fail at once
    # and its health checks cannot see the replica recover, so a wait for a healthy replica
    # (--failover-wait-seconds, 3 s) must outlast one backoff. Reconnecting to a dead loopback or
    # in-cluster peer once a second costs nothing worth saving.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

DecoderClient = StageClient[stages_pb2_grpc.DecoderStub]
_UNREACHABLE = object()


class IncompatibleModelsError(RuntimeError):
    """Served models whose frames the decoder pool cannot decode (a startup refusal)."""


def request_limits(config: GatewayConfig) -> RequestLimits:
    """The request size limits of a gateway configuration."""
    return RequestLimits(
        max_text_chars=config.max_text_chars,
        max_instruct_chars=config.max_instruct_chars,
        max_ref_audio_seconds=config.max_ref_audio_seconds,
        max_ref_audio_bytes=config.max_ref_audio_bytes,
    )


class ModelRegistry:
    """The served models and the shared decoder pool (see the module doc)."""

    def __init__(
        self,
        backends: Sequence[ModelBackend],
        decoder: DecoderClient,
        *,
        default: str = "",
        aliases: Sequence[tuple[str, str]] = (),
        aligner: AlignerStage | None = None,
        startup_timeout: float = 0.0,
        health_check_interval: float = 1.0,
        health_check_timeout: float = 2.0,
    ) -> None:
        """``default``: the default model's name ("" = the first); ``aliases``: (alias, name)
        pairs, aliases lower-cased; ``aligner``: the aligner stage every model shares (None:
        no timestamps); ``startup_timeout``: how long :meth:`start` waits for every
        stage (0 = until they answer); ``health_check_*``: the decoder pool's health checks."""
        if not backends:
            raise ValueError("a gateway serves at least one model")
        self.backends = tuple(backends)
        self.decoder = decoder
        self.aligner = aligner
        """The aligner stage (word timestamps), shared like the decoder pool; None: none."""
        self._default = default
        self._aliases = {alias.lower(): name for alias, name in aliases}
        self._startup_timeout = startup_timeout
        self._health = (health_check_interval, health_check_timeout)
        self._serving: ServingHealth | None = None
        self._codec = ""
        """The speech tokenizer every talker model reports ("" if none does)."""
        self._late_checks: list[asyncio.Task[None]] = []

    @classmethod
    def from_config(
        cls, config: GatewayConfig, options: Sequence[tuple[str, Any]] | None = None
    ) -> ModelRegistry:
        """Create every stage client (channels) of ``config``; call inside the event loop.
        ``options``: base channel options (default :func:`tts_common.serving.channel_options`)."""
        opts = [
            *(channel_options() if options is None else options),
            *RECONNECT_OPTIONS,
            *keepalive_channel_options(config.keepalive_seconds, config.keepalive_timeout_seconds),
            *config.channel_options,
        ]

        def client(service: str, targets: Sequence[str], stub: Callable[[grpc.aio.Channel], Any]) -> Any:
            """The stage's client, health-checked on its own service name."""
            return StageClient(
                service.lower(), targets, stub, options=opts, health_service=service_name(stages_pb2, service)
            )

        failover = FailoverPolicy.from_config(config)
        limits = request_limits(config)
        routes = config.models or (ModelRoute("", config.talker_targets, config.speaker_targets),)
        backends = []
        for route in routes:
            speaker = None
            if route.speaker_targets:
                speaker = SpeakerStage(
                    client("Speaker", route.speaker_targets, stages_pb2_grpc.SpeakerStub),
                    limits,
                    config.stage_timeout_seconds,
                    failover=failover,
                )
            backends.append(
                ModelBackend(
                    route.name or None,
                    client("Talker", route.talker_targets, stages_pb2_grpc.TalkerStub),
                    speaker,
                    info_ttl_seconds=config.model_info_ttl_seconds,
                    stage_timeout_seconds=config.stage_timeout_seconds,
                    health_check_interval=config.health_check_interval_seconds,
                    health_check_timeout=config.health_check_timeout_seconds,
                )
            )
        decoder = client("Decoder", config.decoder_targets, stages_pb2_grpc.DecoderStub)
        aligner = None
        if config.aligner_targets:
            aligner = AlignerStage(
                client("Aligner", config.aligner_targets, stages_pb2_grpc.AlignerStub),
                config.stage_timeout_seconds,
                failover=failover,
            )
        return cls(
            backends,
            decoder,
            default=config.default_model,
            aliases=config.model_alias,
            aligner=aligner,
            startup_timeout=config.startup_timeout_seconds,
            health_check_interval=config.health_check_interval_seconds,
            health_check_timeout=config.health_check_timeout_seconds,
        )

    # --- choosing a model -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[ModelBackend]:
        return iter(self.backends)

    @property
    def names(self) -> list[str]:
        """The served names, the default first."""
        default = self.default
        return [default.name] + [b.name for b in self.backends if b is not default]

    @property
    def default(self) -> ModelBackend:
        """The model of requests that name none."""
        if self._default:
            for backend in self.backends:
                if backend.name == self._default:
                    return backend
        return self.backends[0]

    def get(self, name: str) -> ModelBackend:
        """The model a request's ``model`` names ("" = the default; aliases resolved);
        NotFoundError listing the served names for any other."""
        wanted = name.strip()
        if not wanted:
            return self.default
        wanted = self._aliases.get(wanted.lower(), wanted)
        for backend in self.backends:
            if backend.name == wanted:
                return backend
        aliases = f"; aliases: {', '.join(sorted(self._aliases))}" if self._aliases else ""
        raise NotFoundError(
            f"unknown model {name!r} (served: {', '.join(self.names)}{aliases}; see ListModels)"
        )

    def find(self, what: str, accepts: Callable[[ModelBackend, stages_pb2.TalkerInfo], bool]) -> ModelBackend:
        """The default model if ``accepts`` it (with its talker's cached info), else the first
        that does; FailedPreconditionError saying no served model is ``what``."""
        for backend in (self.default, *self.backends):
            info = backend.info.cached
            if info is not None and accepts(backend, info):
                return backend
        described = ", ".join(
            f"{b.name} ({b.info.cached.model.model_type or '?'})" if b.info.cached else b.name for b in self
        )
        raise FailedPreconditionError(f"no served model is {what} (served: {described})")

    # --- lifecycle ------------------------------------------------------------------------------
    @property
    def stage_clients(self) -> tuple[StageClient[Any], ...]:
        """Every stage client: each model's talker and speaker, the decoder pool and the
        aligner."""
        aligner = (self.aligner.client,) if self.aligner is not None else ()
        return tuple(c for b in self.backends for c in b.stage_clients) + (self.decoder, *aligner)

    def tie_readiness(self, health: ServingHealth) -> None:
        """NOT_SERVING while the decoder pool, or every model's talker, has no reachable
        replica (a model whose talkers are all down fails its own requests with UNAVAILABLE
        naming the talker; the others go on). Speakers and the aligner are left out: without
        one only voice cloning (timestamps) fails."""
        self._serving = health
        tie_readiness(health, [*(b.talker for b in self.backends), self.decoder])

    async def start(self) -> None:
        """Start checking the stages' health, wait for every model's talker, and check that
        the decoder pool decodes every model's frames (:class:`IncompatibleModelsError`
        otherwise; a decoder replica not up yet is checked when it answers, see the module
        doc)."""
        self.decoder.start_health_checks(*self._health)
        if self.aligner is not None:
            self.aligner.client.start_health_checks(*self._health)
        infos = await asyncio.gather(*(b.start(self._startup_timeout) for b in self.backends))
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise IncompatibleModelsError(
                f"two talkers report the same model name ({', '.join(names)}): name them with --models"
            )
        self._codec = self._models_codec(list(zip(self.backends, infos)))
        for endpoint in self.decoder.endpoints:
            info = await self._decoder_info(endpoint, wait=False)
            if info is _UNREACHABLE:
                self._late_checks.append(
                    asyncio.create_task(self._check_later(endpoint), name=f"codec check {endpoint.target}")
                )
            else:
                self._check_decoder(endpoint.target, info)
        logger.info(
            "serving %d model(s): %s (default %s); aligner stage %s",
            len(names),
            ", ".join(names),
            self.default.name,
            "configured (timestamps)" if self.aligner is not None else "not configured (no timestamps)",
        )

    @staticmethod
    def _models_codec(models: list[tuple[ModelBackend, stages_pb2.TalkerInfo]]) -> str:
        """The speech tokenizer every model reports ("" if none does); IncompatibleModelsError if
        two differ."""
        reported = [(b, info.speech_tokenizer) for b, info in models if info.speech_tokenizer]
        for backend, info in models:
            if not info.speech_tokenizer:
                logger.warning("model %s does not report its speech tokenizer: not checked", backend.name)
        codecs = {fingerprint for _, fingerprint in reported}
        if len(codecs) > 1:
            listing = ", ".join(f"{b.name}: {short_fingerprint(f)}" for b, f in reported)
            raise IncompatibleModelsError(
                f"the served models have different speech tokenizers ({listing}): one decoder pool serves only "
                "talker models with the same speech tokenizer (serve the others behind their own gateway and "
                "decoders)"
            )
        return codecs.pop() if codecs else ""

    def _check_decoder(self, target: str, info: stages_pb2.DecoderInfo | None) -> None:
        """IncompatibleModelsError if the decoder at ``target`` decodes another codec than the
        models' (a decoder or models that report none are not checked)."""
        if info is None or not info.speech_tokenizer:
            logger.warning("decoder %s does not report its speech tokenizer: not checked", target)
            return
        if not self._codec or info.speech_tokenizer == self._codec:
            logger.info(
                "decoder %s decodes speech tokenizer %s", target, short_fingerprint(info.speech_tokenizer)
            )
            return
        models = ", ".join(b.name for b in self.backends)
        raise IncompatibleModelsError(
            f"decoder {target} decodes speech tokenizer {short_fingerprint(info.speech_tokenizer)}, but the "
            f"served models ({models}) use {short_fingerprint(self._codec)}: one decoder pool serves only talker "
            "models with its speech tokenizer (point the decoders at a checkpoint of these models, or serve the "
            "models behind their own gateway and decoders)"
        )

    async def _decoder_info(self, endpoint: Any, *, wait: bool) -> Any:
        """The decoder endpoint's info; None if it has no GetModelInfo; ``_UNREACHABLE`` if it
        did not answer (``wait``: retry until it does)."""
        delay = 0.25
        while True:
            try:
                return await endpoint.stub.GetModelInfo(
                    stages_pb2.GetModelInfoRequest(), timeout=STARTUP_PROBE_TIMEOUT_S, wait_for_ready=wait
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    return None
                if not wait:
                    return _UNREACHABLE
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _check_later(self, endpoint: Any) -> None:
        """Check a decoder replica that was not up at startup when it answers; a mismatch keeps
        the gateway NOT_SERVING."""
        info = await self._decoder_info(endpoint, wait=True)
        try:
            self._check_decoder(endpoint.target, info)
        except IncompatibleModelsError as exc:
            logger.error("%s; not serving until restarted", exc)
            if self._serving is not None:
                self._serving.set_dependency("decoder speech tokenizer", False)

    async def close(self) -> None:
        """Stop the late decoder checks and close every stage channel."""
        for task in self._late_checks:
            task.cancel()
        await asyncio.gather(*self._late_checks, return_exceptions=True)
        for backend in self.backends:
            await backend.close()
        await self.decoder.close()
        if self.aligner is not None:
            await self.aligner.client.close()


__all__ = ["IncompatibleModelsError", "ModelRegistry", "RECONNECT_OPTIONS", "request_limits"]
