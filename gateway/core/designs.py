"""A designed voice's reference ("Voice Design, then Clone", the first step): a VoiceDesign model
speaks the design's sample text in the described voice (:meth:`SynthesisContext.render`, holding a
stream place like any synthesis), and that audio becomes the reference a Base model's speaker stage
clones, its text the transcript. Because every later segment is cloned from that one reference,
the voice stays the same over a long text, unlike a VoiceDesign description, which is interpreted
anew for every segment."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.logging_setup import model_context
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis.validation import check_text, model_label

from ..stages.backend import ModelBackend
from ..stages.models import ModelRegistry
from ..synthesis.context import SynthesisContext
from .admission import Admission

logger = logging.getLogger(__name__)


def is_voice_design(talker: stages_pb2.TalkerInfo) -> bool:
    return talker.model.model_type == "voice_design"


@dataclass(frozen=True)
class VoiceDesigner:
    """Designed references over the served VoiceDesign models (see the module doc)."""

    models: ModelRegistry
    context: SynthesisContext
    admission: Admission

    def check(self, design: tts_pb2.VoiceDesign) -> None:
        """INVALID_ARGUMENT unless the design has an instruction and a text within the limits."""
        limits = self.context.limits
        if not design.instruct.strip():
            raise InvalidRequestError("design.instruct is required: describe the voice")
        check_text(design.instruct, limits.max_instruct_chars, "design.instruct")
        if not design.text.strip():
            raise InvalidRequestError("design.text is required: what the voice says in its reference")
        check_text(design.text, limits.max_instruct_chars, "design.text")

    def model(self, name: str) -> ModelBackend:
        """The VoiceDesign model that speaks a design: the one named, else the first served."""
        if not name.strip():
            return self.models.find(
                "a VoiceDesign model (it speaks the designed reference)",
                lambda backend, talker: is_voice_design(talker),
            )
        backend = self.models.get(name)
        talker = backend.info.cached
        if talker is not None and not is_voice_design(talker):
            raise FailedPreconditionError(
                f"design.model {name!r} is a {model_label(talker.model)} model; a voice is designed by a "
                "voice_design model"
            )
        return backend

    async def reference(
        self, design: tts_pb2.VoiceDesign, request_id: str, time_remaining: float | None
    ) -> tuple[tts_pb2.VoiceClone, tts_pb2.VoiceDesign]:
        """The designed reference (native-rate float32, its text the transcript) and the design
        as done (its model and seed)."""
        designer = self.model(design.model)
        request = tts_pb2.SynthesizeRequest(
            text=design.text,
            language=design.language,
            instruct=design.instruct,
            output=tts_pb2.AudioFormat(encoding=tts_pb2.AUDIO_ENCODING_FLOAT32),
        )
        if design.HasField("seed"):
            request.sampling.seed = design.seed
        with model_context(designer.name), self.admission.admit(time.monotonic(), designer):
            prepared, audio, results = await self.context.render(
                designer, request, request_id, time_remaining, single_segment="design.text"
            )
        if not audio.size:
            raise InvalidRequestError(
                f"model {designer.name!r} said nothing for design.text (finish reason "
                f"{tts_pb2.FinishReason.Name(results[0].finish_reason) if results else 'none'}); try another text or seed"
            )
        reference = tts_pb2.VoiceClone(
            ref_audio=audio.astype("<f4").tobytes(),
            ref_audio_encoding=tts_pb2.REFERENCE_AUDIO_ENCODING_RAW_FLOAT32,
            ref_audio_sample_rate=prepared.info.sample_rate,
            ref_text=design.text,
        )
        done = tts_pb2.VoiceDesign(
            instruct=design.instruct,
            text=design.text,
            language=prepared.plan.language,
            seed=prepared.plan.sampling.seed or 0,
            model=designer.name,
        )
        logger.info(
            "designed a reference with model %s: %.2f s, seed %d",
            designer.name,
            audio.size / reference.ref_audio_sample_rate,
            done.seed,
        )
        return reference, done


__all__ = ["VoiceDesigner", "is_voice_design"]
