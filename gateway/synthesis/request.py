"""A request made ready to synthesize: validated against its model and its voice resolved
(:func:`prepare` -> :class:`PreparedRequest`), for ``Synthesize`` and a ``StreamingSynthesize``
configuration alike.

The checks are the shared validator's (``tts_common.synthesis``: text, language, voice kind,
instruct, text feeding, sampling, budget) plus the gateway's own: the output format and chunking
(:func:`plan_output`) and a registered voice's family (:mod:`.voice`). A registered voice is
looked up first, so that a voice used with a model of another family is FAILED_PRECONDITION
naming both rather than a complaint about the voice kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from tts_common.chunking import resolve_chunking
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import (
    RequestLimits,
    SynthesisPlan,
    native_sample_rate,
    plan_sampling_options,
    plan_synthesis,
)

from ..config import GatewayConfig
from ..encoding import AudioOutput, check_output_format, default_sample_rate
from ..stages.backend import ModelBackend
from ..voice_library import Caller, VoiceLibrary
from .responses import OutputPlan, ResponseBuilder
from .voice import ResolvedVoice, check_voice_family, find_registered_voice, resolve_voice


def plan_output(
    request: tts_pb2.SynthesizeRequest, info: tts_pb2.ModelInfo, default_first: int, default_max: int
) -> OutputPlan:
    """Encoding (UNSPECIFIED -> PCM16), sample rate (0 -> native, 8000 Hz for the G.711 encodings)
    and chunk sizes (0 -> the server's defaults) of a request."""
    encoding = request.output.encoding or tts_pb2.AUDIO_ENCODING_PCM16
    sample_rate = request.output.sample_rate or default_sample_rate(encoding, native_sample_rate(info))
    check_output_format(encoding, sample_rate)
    first, largest = resolve_chunking(
        request.streaming.first_chunk_frames,
        request.streaming.max_chunk_frames,
        default_first=default_first,
        default_max=default_max,
    )
    return OutputPlan(
        encoding=encoding, sample_rate=sample_rate, first_chunk_frames=first, max_chunk_frames=largest
    )


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request with its voice resolved (Synthesize, or a StreamingSynthesize
    configuration)."""

    model: str
    """The served model's name."""
    plan: SynthesisPlan
    output_plan: OutputPlan
    info: tts_pb2.ModelInfo
    """The model as clients see it."""
    voice: ResolvedVoice
    max_seq_len: int
    """Positions of one talker slot (0: unknown)."""

    def responses(self, request_id: str, received: float, speed: float) -> ResponseBuilder:
        """The builder of this request's responses (its output plan; ``speed``: the time-scale
        factor), timed from ``received``."""
        out = self.output_plan
        output = AudioOutput(out.encoding, out.sample_rate, native_sample_rate(self.info), speed=speed)
        return ResponseBuilder(self.metadata(request_id), out, output, received, model=self.model)

    def metadata(self, request_id: str) -> tts_pb2.SynthesisMetadata:
        """What the stream's first response says."""
        plan, out, info = self.plan, self.output_plan, self.info
        return tts_pb2.SynthesisMetadata(
            request_id=request_id,
            sample_rate=out.sample_rate,
            encoding=out.encoding,
            model_type=info.model_type,
            model_size=info.model_size,
            model_name=info.model_name,
            language=plan.language,
            text_feeding=plan.text_feeding,
            sampling=plan_sampling_options(plan),
        )


async def prepare(
    backend: ModelBackend,
    voices: VoiceLibrary,
    caller: Caller,
    request: tts_pb2.SynthesizeRequest,
    request_id: str,
    time_remaining: float | None,
    config: GatewayConfig,
    limits: RequestLimits,
    *,
    streamed_text: bool = False,
) -> PreparedRequest:
    """Validate a Synthesize request (or, ``streamed_text``, a StreamingSynthesize
    configuration) against ``backend``'s model and resolve its voice (see the module doc): a
    registered one is ``caller``'s, read from the library ``voices``."""
    talker = await backend.talker_info()
    info = backend.public_info(talker)
    stored = None
    if request.WhichOneof("voice") == "voice_id" and request.voice_id.strip():
        stored = await find_registered_voice(voices, caller, request.voice_id.strip())
        if stored is not None:
            check_voice_family(stored, backend, talker)
    plan = plan_synthesis(request, info, limits, streamed_text=streamed_text)
    out = plan_output(request, info, config.default_first_chunk_frames, config.default_max_chunk_frames)
    voice = await resolve_voice(plan, stored, backend, talker, request_id, time_remaining)
    return PreparedRequest(backend.name, plan, out, info, voice, talker.max_seq_len)


__all__ = ["PreparedRequest", "plan_output", "prepare"]
