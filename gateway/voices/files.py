"""The :class:`~gateway.voices.store.VoiceStore` of a gateway without a database: voices in
memory and, with a directory, one ``<voice_id>.json`` per voice (written atomically: temp file +
rename), loaded at startup. JSON keeps the files inspectable; float32 values round-trip exactly
through JSON numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

from tts_common.errors import CapacityError, NotFoundError

from .store import VOICE_ID, StoredVoice

logger = logging.getLogger(__name__)


class FileVoiceStore:
    """Registered voices by id, optionally persisted in ``directory`` (see the module doc)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, max_voices: int = 1000) -> None:
        self.directory = Path(directory) if directory else None
        self.max_voices = max_voices
        self._voices: dict[str, StoredVoice] = {}

    def __len__(self) -> int:
        return len(self._voices)

    async def load(self) -> int:
        """Read the persisted voices (creating the directory if needed); unreadable files are
        logged and skipped. Returns how many were loaded."""
        return await asyncio.to_thread(self._load)

    def _load(self) -> int:
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

    async def list_voices(self, family: str | None = None) -> list[StoredVoice]:
        """All voices (of ``family``, and those registered before families, when given), oldest
        first."""
        return sorted(
            (v for v in self._voices.values() if family is None or v.family in ("", family)),
            key=lambda v: (v.voice.created_at.seconds, v.voice.created_at.nanos, v.voice_id),
        )

    async def find(self, voice_id: str) -> StoredVoice | None:
        """The voice ``voice_id``, or None.

        A miss is looked up in the directory too: with several gateway replicas sharing one
        voices directory, a voice registered through another replica is found without a restart.
        """
        voice = self._voices.get(voice_id)
        if voice is None and self.directory is not None and VOICE_ID.match(voice_id):
            voice = await asyncio.to_thread(self._read, self.directory / f"{voice_id}.json")
            if voice is not None and voice.voice_id == voice_id:
                self._voices[voice_id] = voice
            else:
                voice = None
        return voice

    async def get(self, voice_id: str) -> StoredVoice:
        """The voice ``voice_id``; :class:`NotFoundError` if unknown."""
        voice = await self.find(voice_id)
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

    async def check_capacity(self) -> None:
        """:class:`CapacityError` if no further voice can be registered."""
        if len(self._voices) >= self.max_voices:
            raise CapacityError(
                f"voice limit reached ({self.max_voices} registered voices); delete some first"
            )

    async def add(self, voice: StoredVoice) -> None:
        """Store (and persist) a new voice; :class:`CapacityError` beyond ``max_voices``."""
        await self.check_capacity()
        self._voices[voice.voice_id] = voice  # reserve before the await: concurrent adds count
        if self.directory is not None:
            try:
                await asyncio.to_thread(self._write, voice)
            except BaseException:
                self._voices.pop(voice.voice_id, None)
                raise

    async def delete(self, voice_id: str) -> StoredVoice:
        """Remove a voice (and its file); :class:`NotFoundError` if unknown."""
        voice = await self.get(voice_id)
        self._voices.pop(voice_id, None)
        if self.directory is not None:
            path = self.directory / f"{voice_id}.json"
            await asyncio.to_thread(path.unlink, missing_ok=True)
        return voice

    async def close(self) -> None:
        """Nothing to release (files are written whole on every change)."""

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


__all__ = ["FileVoiceStore"]
