"""Offline synthesis (``qwen3-tts synthesize``): the reference pipeline in one process.

Reference audio -> (speaker stage models) x-vector and ICL codes -> talker generation -> whole
utterance decode, as the official implementation does it (float32 by default, the official
300-frame chunked decode, the official ICL cut). The gRPC stack must produce the same audio.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decoder_service.model.loading import load_codec_decoder
from speaker_service.model.frontend import VoiceCloneFrontEnd
from talker_service.model.generate import generate
from talker_service.model.loader import TalkerModel
from talker_service.model.prompt import SynthesisRequest
from talker_service.model.sampling import SamplingParams
from tts_common.audio import AudioError, read_audio_file
from tts_common.errors import InvalidRequestError

REQUEST_KEYS = {
    "id",
    "text",
    "language",
    "speaker",
    "instruct",
    "non_streaming_text",
    "ref_audio",
    "ref_text",
    "x_vector_only",
}


@dataclass
class OfflineRequest:
    """One utterance of the offline command (the fixtures' ``requests.jsonl`` format)."""

    id: str
    text: str
    language: str = "auto"
    speaker: str | None = None
    instruct: str | None = None
    non_streaming_text: bool | None = None
    ref_audio: Path | None = None
    ref_text: str | None = None
    x_vector_only: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any], base_dir: Path, index: int) -> OfflineRequest:
        """A request line; relative ``ref_audio`` resolved against ``base_dir``; unknown keys ignored."""
        fields = {k: v for k, v in data.items() if k in REQUEST_KEYS}
        fields.setdefault("id", f"{index:04d}")
        if "text" not in fields:
            raise InvalidRequestError(f"request {fields['id']}: missing 'text'")
        if fields.get("ref_audio"):
            fields["ref_audio"] = (base_dir / fields["ref_audio"]).resolve()
        return cls(**fields)


def read_requests(path: str | Path) -> list[OfflineRequest]:
    """Requests of a JSONL file (one JSON object per non-empty line)."""
    path = Path(path)
    out = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if line.strip():
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidRequestError(f"{path}:{i + 1}: invalid JSON: {exc}") from exc
                out.append(OfflineRequest.from_json(data, path.parent, i))
    return out


@dataclass
class OfflineResult:
    codes: np.ndarray
    """[frames, 16] int64, the EOS frame excluded."""
    wav: np.ndarray
    """float32 mono at :attr:`OfflineSynthesizer.sample_rate`."""


class OfflineSynthesizer:
    """Talker, decoder and (Base checkpoints) the voice-clone front end of one checkpoint."""

    def __init__(
        self, model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        self.talker = TalkerModel.from_checkpoint(model_dir, device, dtype)
        self.decoder = load_codec_decoder(model_dir, device, dtype)
        cfg = self.talker.config
        self.frontend = (
            VoiceCloneFrontEnd.from_checkpoint(model_dir, device, dtype)
            if cfg.model.tts_model_type == "base"
            else None
        )
        self.sample_rate = cfg.speech_tokenizer.output_sample_rate

    def to_synthesis_request(self, req: OfflineRequest) -> SynthesisRequest:
        """Validate the request's voice inputs and run the speaker models for voice cloning."""
        if req.ref_text and req.ref_audio is None:
            raise InvalidRequestError(f"request {req.id}: ref_text needs ref_audio")
        if req.ref_text and req.x_vector_only:
            raise InvalidRequestError(f"request {req.id}: ref_text and x_vector_only exclude each other")
        embedding = codes = None
        if req.ref_audio is not None:
            if self.frontend is None:
                raise InvalidRequestError(
                    f"request {req.id}: voice cloning needs a Base checkpoint, this one is "
                    f"{self.talker.config.model.tts_model_type}"
                )
            if not req.x_vector_only and not req.ref_text:
                raise InvalidRequestError(
                    f"request {req.id}: voice cloning needs ref_text (or x_vector_only)"
                )
            try:
                audio = read_audio_file(req.ref_audio, target_sample_rate=self.frontend.sample_rate)
            except AudioError as exc:
                raise InvalidRequestError(
                    f"request {req.id}: reference audio {req.ref_audio}: {exc}"
                ) from exc
            with torch.inference_mode():
                embedding = self.frontend.embed(audio)
                codes = None if req.x_vector_only else self.frontend.encode_reference(audio)
        return SynthesisRequest(
            text=req.text,
            language=req.language or "auto",
            speaker=req.speaker,
            instruct=req.instruct,
            non_streaming_text=req.non_streaming_text,
            speaker_embedding=embedding,
            ref_codes=codes,
            ref_text=None if req.x_vector_only else req.ref_text,
        )

    def synthesize(
        self, requests: list[OfflineRequest], params: SamplingParams | None, max_new_tokens: int | None = None
    ) -> list[OfflineResult]:
        """Generate and decode every request (one batch; identical to running each alone)."""
        synthesis = [self.to_synthesis_request(r) for r in requests]
        prompts = [self.talker.build_prompt(s) for s in synthesis]
        budget = max_new_tokens or self.talker.config.generation.max_new_tokens
        codes = generate(self.talker, prompts, budget, params)
        prefixes = [None if s.ref_codes is None else torch.as_tensor(s.ref_codes) for s in synthesis]
        wavs = self.decoder.decode_utterances(codes, prefixes)
        return [
            OfflineResult(c.cpu().numpy().astype(np.int64), w.cpu().numpy().astype(np.float32))
            for c, w in zip(codes, wavs)
        ]
