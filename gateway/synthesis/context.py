"""What every synthesis needs of its gateway, whatever asks for it (Synthesize,
StreamingSynthesize, a designed voice's reference): :class:`SynthesisContext` prepares a
request for a model, cuts its text into segments and runs its utterances through the model's
talkers and the shared decoder pool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2_grpc
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import RequestLimits, native_sample_rate
from tts_common.text import TokenCounter

from ..config import GatewayConfig
from ..stages.aligner import AlignerStage
from ..stages.backend import ModelBackend
from ..stages.routing import StageClient
from ..voice_library import NO_KEYS, Caller, VoiceLibrary
from .request import PreparedRequest, prepare
from .responses import ResponseBuilder
from .segmentation import Segmentation, segment_size
from .timestamps import Timestamper, check_timestamps
from .utterances import (
    UtteranceAudio,
    UtteranceDone,
    UtterancePlan,
    UtteranceSequence,
    sequence_settings,
    utterance_plan,
)


@dataclass(frozen=True)
class SynthesisContext:
    """The gateway's settings, the decoder pool, the voice library and the aligner stage (see
    the module doc)."""

    config: GatewayConfig
    decoder: StageClient[stages_pb2_grpc.DecoderStub]
    voices: VoiceLibrary
    limits: RequestLimits
    aligner: AlignerStage | None = None
    """Word timings (None: requests asking for them fail with FAILED_PRECONDITION)."""

    async def prepare(
        self,
        backend: ModelBackend,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        time_remaining: float | None,
        *,
        caller: Caller,
        streamed_text: bool = False,
    ) -> PreparedRequest:
        """``request`` validated against ``backend``'s model, its voice resolved (a registered
        voice: ``caller``'s)."""
        return await prepare(
            backend,
            self.voices,
            caller,
            request,
            request_id,
            time_remaining,
            self.config,
            self.limits,
            streamed_text=streamed_text,
        )

    def check_request(self, request: tts_pb2.SynthesizeRequest) -> bool:
        """The checks of a request (or a configuration) that need neither its model nor a stage,
        made before it is admitted, so that a request this gateway can never serve costs no
        admission, no voice lookup and no speaker-stage clone: its ``timestamps``
        (:func:`~.timestamps.check_timestamps`; FAILED_PRECONDITION without an aligner stage).
        Whether it asks for timestamps (then :meth:`timestamper`)."""
        return check_timestamps(request.timestamps, self.aligner)

    def timestamper(
        self,
        request: tts_pb2.SynthesizeRequest,
        prepared: PreparedRequest,
        builder: ResponseBuilder,
        ready: asyncio.Queue[Any],
        request_id: str,
        time_remaining: float | None,
    ) -> Timestamper:
        """The timings of a stream whose request (or configuration) asks for ``timestamps``
        (:meth:`check_request` said so), put into ``ready`` (the stream's response queue) as
        they come."""
        assert self.aligner is not None, "check_request refuses timestamps without an aligner"
        return Timestamper(
            self.aligner,
            request.timestamps,
            prepared.plan.language,
            builder,
            ready,
            request_id,
            sample_rate=native_sample_rate(prepared.info),
            time_remaining=time_remaining,
        )

    def segment_size(self, backend: ModelBackend, prepared: PreparedRequest) -> tuple[int, TokenCounter]:
        """The most text tokens one talker request of a prepared request may take, and the
        token counter (its model's talker's tokenizer) they are counted with."""
        return segment_size(
            backend, prepared.plan, prepared.voice, prepared.max_seq_len, self.config.segment_tokens
        )

    async def segmentation(self, backend: ModelBackend, prepared: PreparedRequest) -> Segmentation:
        """The prepared request's text being cut into segments."""
        return await Segmentation.start(prepared.plan, *self.segment_size(backend, prepared))

    def sequence(
        self, backend: ModelBackend, prepared: PreparedRequest, time_remaining: float | None
    ) -> UtteranceSequence:
        """The utterance sequence a prepared request's utterances run through (its model's
        talkers, the shared decoder pool)."""
        return UtteranceSequence(
            backend.talker,
            self.decoder,
            sequence_settings(self.config, prepared.plan, prepared.info),
            time_remaining=time_remaining,
        )

    @staticmethod
    async def plans(
        segmentation: Segmentation, prepared: PreparedRequest, request_id: str
    ) -> AsyncIterator[UtterancePlan]:
        """What the stages are sent for each segment, as the segments become known."""
        async for segment in segmentation.segments():
            yield utterance_plan(segment, request_id, prepared.voice, prepared.output_plan)

    async def render(
        self,
        backend: ModelBackend,
        request: tts_pb2.SynthesizeRequest,
        request_id: str,
        time_remaining: float | None,
        *,
        single_segment: str = "",
    ) -> tuple[PreparedRequest, np.ndarray, list[UtteranceDone]]:
        """Speak ``request`` with ``backend`` into native-rate float32 PCM, without a response
        stream (a designed voice's reference): the prepared request, the audio and each
        segment's end. ``single_segment``: the text must fit one talker request (else
        INVALID_ARGUMENT naming this field), checked before anything is spoken. The request
        names no registered voice (its voice is described)."""
        prepared = await self.prepare(backend, request, request_id, time_remaining, caller=NO_KEYS)
        segmentation = await self.segmentation(backend, prepared)
        if single_segment and len(segments := await segmentation.complete()) > 1:
            raise InvalidRequestError(
                f"{single_segment} is too long: {len(segments)} segments; it must fit one talker request "
                "(a sentence or two)"
            )
        sequence = self.sequence(backend, prepared, time_remaining)
        pieces: list[np.ndarray] = []
        async with contextlib.aclosing(
            sequence.events(self.plans(segmentation, prepared, request_id))
        ) as events:
            async for event in events:
                if isinstance(event, UtteranceAudio):
                    pieces.append(event.samples)
        audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return prepared, audio, sequence.results


__all__ = ["SynthesisContext"]
