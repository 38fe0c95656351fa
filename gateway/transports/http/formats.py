"""The HTTP API's ``response_format`` values: OpenAI's six plus G.711 for telephony, each an
``AudioEncoding`` of the shared encoders (:mod:`gateway.encoding`) and a media type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from tts_common.pb.qwen3tts.v1 import tts_pb2

FormatName = Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "mulaw", "alaw"]
StreamFormat = Literal["audio", "sse", "json"]
"""How ``POST /v1/audio/speech`` answers: the audio bytes as they come, OpenAI's server-sent
events, or (ours) one JSON body once everything is spoken: the audio in base64 with the
timestamps and the summary (:func:`gateway.transports.http.streaming.json_body`)."""


@dataclass(frozen=True)
class ResponseFormat:
    """One ``response_format``: the encoder that produces it and its media type."""

    name: str
    encoding: int
    media_type: str


RESPONSE_FORMATS: dict[str, ResponseFormat] = {
    f.name: f
    for f in (
        ResponseFormat("mp3", tts_pb2.AUDIO_ENCODING_MP3, "audio/mpeg"),
        # OpenAI's "opus" is Opus in an Ogg container.
        ResponseFormat("opus", tts_pb2.AUDIO_ENCODING_OGG_OPUS, "audio/ogg; codecs=opus"),
        ResponseFormat("aac", tts_pb2.AUDIO_ENCODING_AAC, "audio/aac"),
        ResponseFormat("flac", tts_pb2.AUDIO_ENCODING_FLAC, "audio/flac"),
        ResponseFormat("wav", tts_pb2.AUDIO_ENCODING_WAV, "audio/wav"),
        # OpenAI's "pcm": raw 16-bit little-endian mono at 24 kHz, no header.
        ResponseFormat("pcm", tts_pb2.AUDIO_ENCODING_PCM16, "audio/pcm"),
        ResponseFormat("mulaw", tts_pb2.AUDIO_ENCODING_MULAW, "audio/basic"),
        ResponseFormat("alaw", tts_pb2.AUDIO_ENCODING_ALAW, "audio/x-alaw-basic"),
    )
}
"""Every accepted ``response_format``."""

assert set(RESPONSE_FORMATS) == set(get_args(FormatName)), "FormatName and RESPONSE_FORMATS disagree"

SSE_MEDIA_TYPE = "text/event-stream"

__all__ = ["RESPONSE_FORMATS", "SSE_MEDIA_TYPE", "FormatName", "ResponseFormat", "StreamFormat"]
