"""The voice library's own error: its database cannot answer now. The other outcomes use the
project's errors (``tts_common.errors``): NotFoundError (unknown, or another owner's voice),
CapacityError (``max_voices`` or the owner's quota), InvalidRequestError (a bad field or
document)."""

from __future__ import annotations

from tts_common.errors import UnavailableError


class VoiceStoreUnavailableError(UnavailableError):
    """The voice database is down, unreachable, locked or slower than the operation's timeout.
    Reported as UNAVAILABLE; ``retry_after_s`` is the hint for the client (HTTP ``Retry-After``)."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(f"{message}; retry in {retry_after_s:g} s")
        self.retry_after_s = retry_after_s


__all__ = ["VoiceStoreUnavailableError"]
