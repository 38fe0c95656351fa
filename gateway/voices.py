"""Registered (cloned) voices: speaker embedding + reference codes + transcript under an id.

Voices live in memory; with a directory they are also persisted, one ``<voice_id>.json`` per
voice (written atomically: temp file + rename), and loaded at startup. JSON keeps the files
inspectable; float32 values round-trip exactly through JSON numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from tts_common.errors import CapacityError, NotFoundError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_VOICE_ID = re.compile(r"^voice-[0-9a-f]{32}$")


def new_voice_id() -> str:
    """A fresh voice id (``voice-`` + 32 hex digits)."""
    return f"voice-{uuid.uuid4().hex}"


@dataclass
class StoredVoice:
    """A registered voice with what the talker needs to speak with it."""

    voice: tts_pb2.Voice
    """The public description (id, name, x_vector_only, ref_text, duration, creation time)."""

    speaker_embedding: list[float]
    """The x-vector (TalkerRequest.speaker_embedding)."""

    ref_codes: stages_pb2.Codes | None
    """Reference codes for in-context cloning; None for x-vector-only voices."""

    model_name: str = ""
    """Model the voice was registered with (for diagnostics)."""

    audio_sha256: str = ""
    """Digest of the reference audio reported by the speaker stage."""

    @property
    def voice_id(self) -> str:
        return self.voice.voice_id

    def to_json(self) -> dict[str, Any]:
        """The persisted form."""
        codes = self.ref_codes
        return {
            "format_version": FORMAT_VERSION,
            "voice_id": self.voice.voice_id,
            "name": self.voice.name,
            "x_vector_only": self.voice.x_vector_only,
            "ref_text": self.voice.ref_text,
            "ref_audio_seconds": self.voice.ref_audio_seconds,
            "created_at": self.voice.created_at.ToJsonString(),
            "model_name": self.model_name,
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
        if not _VOICE_ID.match(voice_id):
            raise ValueError(f"malformed voice_id {voice_id!r}")
        return cls(
            voice=tts_pb2.Voice(
                voice_id=voice_id,
                name=str(data.get("name", "")),
                x_vector_only=bool(data["x_vector_only"]),
                ref_text=str(data.get("ref_text", "")),
                ref_audio_seconds=float(data.get("ref_audio_seconds", 0.0)),
                created_at=created,
            ),
            speaker_embedding=[float(v) for v in data["speaker_embedding"]],
            ref_codes=ref_codes,
            model_name=str(data.get("model_name", "")),
            audio_sha256=str(data.get("audio_sha256", "")),
        )


class VoiceStore:
    """Registered voices by id, optionally persisted in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, max_voices: int = 1000) -> None:
        self.directory = Path(directory) if directory else None
        self.max_voices = max_voices
        self._voices: dict[str, StoredVoice] = {}

    def __len__(self) -> int:
        return len(self._voices)

    def load(self) -> int:
        """Read the persisted voices (creating the directory if needed); unreadable files are
        logged and skipped. Returns how many were loaded."""
        if self.directory is None:
            return 0
        self.directory.mkdir(parents=True, exist_ok=True)
        loaded = 0
        for path in sorted(self.directory.glob("voice-*.json")):
            voice = self._read(path)
            if voice is None:
                continue
            self._voices[voice.voice_id] = voice
            loaded += 1
        logger.info("loaded %d registered voice(s) from %s", loaded, self.directory)
        return loaded

    def list_voices(self) -> list[StoredVoice]:
        """All voices, oldest first."""
        return sorted(
            self._voices.values(),
            key=lambda v: (v.voice.created_at.seconds, v.voice.created_at.nanos, v.voice_id),
        )

    def get(self, voice_id: str) -> StoredVoice:
        """The voice ``voice_id``; :class:`NotFoundError` if unknown.

        A miss is looked up in the directory too: with several gateway replicas sharing one
        voices directory, a voice registered through another replica is found without a restart.
        """
        voice = self._voices.get(voice_id)
        if voice is None and self.directory is not None and _VOICE_ID.match(voice_id):
            voice = self._read(self.directory / f"{voice_id}.json")
            if voice is not None and voice.voice_id == voice_id:
                self._voices[voice_id] = voice
        if voice is None:
            raise NotFoundError(f"unknown voice_id {voice_id!r} (see ListVoices)")
        return voice

    @staticmethod
    def _read(path: Path) -> StoredVoice | None:
        try:
            return StoredVoice.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("skipping unreadable voice file %s: %s", path, exc)
            return None

    def check_capacity(self) -> None:
        """:class:`CapacityError` if no further voice can be registered."""
        if len(self._voices) >= self.max_voices:
            raise CapacityError(
                f"voice limit reached ({self.max_voices} registered voices); delete some first"
            )

    async def add(self, voice: StoredVoice) -> None:
        """Store (and persist) a new voice; :class:`CapacityError` beyond ``max_voices``."""
        self.check_capacity()
        self._voices[voice.voice_id] = voice  # reserve before the await: concurrent adds count
        if self.directory is not None:
            try:
                await asyncio.to_thread(self._write, voice)
            except BaseException:
                self._voices.pop(voice.voice_id, None)
                raise

    async def delete(self, voice_id: str) -> StoredVoice:
        """Remove a voice (and its file); :class:`NotFoundError` if unknown."""
        voice = self.get(voice_id)
        del self._voices[voice_id]
        if self.directory is not None:
            path = self.directory / f"{voice_id}.json"
            await asyncio.to_thread(path.unlink, missing_ok=True)
        return voice

    def _write(self, voice: StoredVoice) -> None:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(voice.to_json(), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.directory / f"{voice.voice_id}.json")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


__all__ = ["FORMAT_VERSION", "StoredVoice", "VoiceStore", "new_voice_id"]
