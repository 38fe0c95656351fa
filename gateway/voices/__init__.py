"""Registered voices: the record and the store interface (:mod:`.store`) and the store of a
gateway without a database (:mod:`.files`). A leaf of the gateway: it imports nothing else of it."""

from .files import FileVoiceStore
from .store import FORMAT_VERSION, StoredVoice, VoiceStore, new_voice_id

__all__ = ["FORMAT_VERSION", "FileVoiceStore", "StoredVoice", "VoiceStore", "new_voice_id"]
