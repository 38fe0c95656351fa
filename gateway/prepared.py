"""A request after validation and voice resolution: what every way of synthesizing starts from
(``Synthesize``, and a ``StreamingSynthesize`` configuration)."""

from __future__ import annotations

from dataclasses import dataclass

from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import SynthesisPlan, native_sample_rate, plan_sampling_options

from .audio_stream import AudioStream, OutputPlan
from .cloning import ResolvedVoice
from .encoding import AudioOutput


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request with its voice resolved (Synthesize, or a StreamingSynthesize
    configuration)."""

    plan: SynthesisPlan
    output_plan: OutputPlan
    info: tts_pb2.ModelInfo
    """The served model as clients see it."""
    voice: ResolvedVoice
    max_seq_len: int
    """Positions of one talker slot (0: unknown)."""

    def audio_stream(self, received: float, speed: float) -> AudioStream:
        """The stream the request's audio goes out through (its output plan; ``speed``: the
        time-scale factor), timed from ``received``."""
        out = self.output_plan
        output = AudioOutput(out.encoding, out.sample_rate, native_sample_rate(self.info), speed=speed)
        return AudioStream(out, output, received)

    def metadata(self, request_id: str) -> tts_pb2.SynthesizeResponse:
        """The stream's first response."""
        plan, out, info = self.plan, self.output_plan, self.info
        return tts_pb2.SynthesizeResponse(
            metadata=tts_pb2.SynthesisMetadata(
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
        )


__all__ = ["PreparedRequest"]
