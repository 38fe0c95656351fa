"""The voice library of one gateway process (:class:`GatewayLibrary`): where it is, from the
settings, and its start, which never holds the gateway back.

Where: ``--voices-db`` (PostgreSQL or SQLite); unset, ``voices.db`` in ``--voices-dir``; with
neither, a SQLite file in a temporary directory removed at exit (what a gateway without a voices
directory always did: registered voices last as long as the process).

Start: the schema is brought up to date and a legacy ``--voices-dir`` imported (once: the library
records it). A database that cannot answer then does not stop the gateway: it serves (preset
speakers, voice design and inline clones need no database; voice calls answer UNAVAILABLE with a
retry hint, and each retries the connection itself), and the start is tried again in the
background, with a growing pause, until it succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

from ..config import GatewayConfig
from ..voice_library import VoiceLibrary, VoiceStoreUnavailableError, create_voice_library

logger = logging.getLogger(__name__)

DEFAULT_DB_NAME = "voices.db"
"""The SQLite file in ``--voices-dir`` when ``--voices-db`` is unset."""
MAX_RETRY_PAUSE_S = 30.0
"""Longest pause between two background attempts to start the library."""


def library_target(config: GatewayConfig) -> str | None:
    """Where ``config`` puts the voice library (None: a temporary file)."""
    if config.voices_db:
        return config.voices_db
    if config.voices_dir:
        return str(Path(config.voices_dir) / DEFAULT_DB_NAME)
    return None


class GatewayLibrary:
    """The gateway's voice library and its start (see the module doc)."""

    def __init__(self, config: GatewayConfig, library: VoiceLibrary | None = None) -> None:
        """``library``: one made elsewhere (tests); else the one ``config`` says."""
        self._temporary: Path | None = None
        if library is None:
            target = library_target(config)
            if target is None:
                self._temporary = Path(tempfile.mkdtemp(prefix="qwen3tts-voices-"))
                target = str(self._temporary / DEFAULT_DB_NAME)
            library = create_voice_library(target, config.voice_library())
        self.library = library
        self.legacy_dir = config.voices_dir
        self._retrying: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        """The schema is up to date and the legacy directory imported."""
        return self._retrying is None or self._retrying.done()

    async def start(self) -> None:
        """Start the library (see the module doc); returns at once if the database cannot answer."""
        if self._temporary is not None:
            logger.warning(
                "no --voices-db or --voices-dir: registered voices are kept in %s until this gateway exits "
                "(not shared with other gateways)",
                self._temporary,
            )
        try:
            await self._prepare()
        except VoiceStoreUnavailableError as exc:
            logger.warning(
                "voice library %s not ready (%s): serving without it, voice calls answer UNAVAILABLE until "
                "it answers; retrying in the background",
                self.library.location,
                exc,
            )
            self._retrying = asyncio.create_task(self._retry(), name="voice-library-start")

    async def _prepare(self) -> None:
        await self.library.start()
        version = await self.library.schema_version()
        logger.info("voice library %s ready (schema version %d)", self.library.location, version)
        if self.legacy_dir:
            report = await self.library.import_legacy_directory(self.legacy_dir)
            if not report.already_done:
                logger.info(
                    "imported %d voice(s) from the legacy voices directory %s (%d already present, %d "
                    "unreadable file(s))",
                    report.imported,
                    report.source,
                    report.already_present,
                    len(report.skipped_files),
                )

    async def _retry(self) -> None:
        pause = self.library.config.retry_after_s
        while True:
            await asyncio.sleep(pause)
            try:
                await self._prepare()
            except VoiceStoreUnavailableError:
                pause = min(pause * 2, MAX_RETRY_PAUSE_S)
                continue
            except Exception:  # logged; the voice calls report it themselves
                logger.exception("voice library %s: starting failed", self.library.location)
            return

    async def close(self) -> None:
        """Stop the background start, close the connections, remove a temporary library."""
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying
        await self.library.close()
        if self._temporary is not None:
            await asyncio.to_thread(shutil.rmtree, self._temporary, True)


__all__ = ["DEFAULT_DB_NAME", "GatewayLibrary", "library_target"]
