"""Registered voices: what one is (:class:`StoredVoice`) and the interface of where they are kept
(:class:`VoiceStore`).

A voice belongs to a model family (``StoredVoice.family``: the talker size its x-vector was made
for, ``TalkerInfo.model.model_size``); every served model of that family can speak it, and the
gateway refuses it to any other (FAILED_PRECONDITION naming both, :mod:`gateway.synthesis.voice`).
Stores only keep voices: who may use a voice and which model speaks it are decided by their
callers. :class:`gateway.voices.files.FileVoiceStore` keeps them in memory and, optionally, one
JSON file each in a directory.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.timestamp_pb2 import Timestamp

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

FORMAT_VERSION = 1
"""Version of :meth:`StoredVoice.to_json`'s form (keys added since stay optional)."""
VOICE_ID = re.compile(r"^voice-[0-9a-f]{32}$")
"""What :func:`new_voice_id` makes."""


def new_voice_id() -> str:
    """A fresh voice id (``voice-`` + 32 hex digits)."""
    return f"voice-{uuid.uuid4().hex}"


@dataclass
class StoredVoice:
    """A registered voice with what the talker needs to speak with it."""

    voice: tts_pb2.Voice
    """The public description (id, name, x_vector_only, ref_text, duration, creation time, model,
    family, design)."""

    speaker_embedding: list[float]
    """The x-vector (TalkerRequest.speaker_embedding)."""

    ref_codes: stages_pb2.Codes | None
    """Reference codes for in-context cloning; None for x-vector-only voices."""

    audio_sha256: str = ""
    """Digest of the reference audio reported by the speaker stage."""

    @property
    def voice_id(self) -> str:
        return self.voice.voice_id

    @property
    def model_name(self) -> str:
        """The model it was registered with."""
        return self.voice.model

    @property
    def family(self) -> str:
        """Its model family ("" for a voice registered before families: any model whose
        x-vector size matches speaks it)."""
        return self.voice.family

    def to_json(self) -> dict[str, Any]:
        """The persisted form."""
        codes = self.ref_codes
        data: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "voice_id": self.voice.voice_id,
            "name": self.voice.name,
            "x_vector_only": self.voice.x_vector_only,
            "ref_text": self.voice.ref_text,
            "ref_audio_seconds": self.voice.ref_audio_seconds,
            "created_at": self.voice.created_at.ToJsonString(),
            "model_name": self.voice.model,
            "family": self.voice.family,
            "audio_sha256": self.audio_sha256,
            "speaker_embedding": list(self.speaker_embedding),
            "ref_codes": None
            if codes is None
            else {
                "num_frames": codes.num_frames,
                "num_codebooks": codes.num_codebooks,
                "values": list(codes.values),
            },
        }
        if self.voice.HasField("design"):
            data["design"] = MessageToDict(self.voice.design, preserving_proto_field_name=True)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoredVoice:
        """Inverse of :meth:`to_json`; ValueError/KeyError on malformed data."""
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {data.get('format_version')!r}")
        created = Timestamp()
        created.FromJsonString(data["created_at"])
        codes = data.get("ref_codes")
        ref_codes = None
        if codes is not None:
            ref_codes = stages_pb2.Codes(
                num_frames=int(codes["num_frames"]),
                num_codebooks=int(codes["num_codebooks"]),
                values=[int(v) for v in codes["values"]],
            )
            if len(ref_codes.values) != ref_codes.num_frames * ref_codes.num_codebooks:
                raise ValueError("ref_codes size does not match num_frames x num_codebooks")
        voice_id = str(data["voice_id"])
        if not VOICE_ID.match(voice_id):
            raise ValueError(f"malformed voice_id {voice_id!r}")
        voice = tts_pb2.Voice(
            voice_id=voice_id,
            name=str(data.get("name", "")),
            x_vector_only=bool(data["x_vector_only"]),
            ref_text=str(data.get("ref_text", "")),
            ref_audio_seconds=float(data.get("ref_audio_seconds", 0.0)),
            created_at=created,
            model=str(data.get("model_name", "")),
            family=str(data.get("family", "")),
        )
        if data.get("design") is not None:
            ParseDict(data["design"], voice.design)
        return cls(
            voice=voice,
            speaker_embedding=[float(v) for v in data["speaker_embedding"]],
            ref_codes=ref_codes,
            audio_sha256=str(data.get("audio_sha256", "")),
        )


class VoiceStore(Protocol):
    """Where registered voices are kept (the gateway's only way to them). Every method may do
    I/O; NotFoundError / CapacityError (``tts_common.errors``) are its refusals."""

    async def load(self) -> int:
        """Open the store at startup; returns how many voices it holds."""
        ...

    async def list_voices(self, family: str | None = None) -> list[StoredVoice]:
        """Every voice (of ``family`` and those without one, when given), oldest first."""
        ...

    async def get(self, voice_id: str) -> StoredVoice:
        """The voice ``voice_id``; NotFoundError if there is none."""
        ...

    async def find(self, voice_id: str) -> StoredVoice | None:
        """The voice ``voice_id``, or None."""
        ...

    async def check_capacity(self) -> None:
        """CapacityError if no further voice can be registered."""
        ...

    async def add(self, voice: StoredVoice) -> None:
        """Keep a new voice (CapacityError beyond the limit)."""
        ...

    async def delete(self, voice_id: str) -> StoredVoice:
        """Remove a voice; NotFoundError if there is none."""
        ...

    async def close(self) -> None:
        """Release what the store holds (connections)."""
        ...


__all__ = ["FORMAT_VERSION", "VOICE_ID", "StoredVoice", "VoiceStore", "new_voice_id"]
