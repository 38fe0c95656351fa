"""Streaming output encoders: float32 24 kHz PCM chunks in, encoded ``AudioChunk`` bytes out.

Per request an :class:`AudioOutput` runs time-scale (``speed``, :mod:`.tempo`) -> resample
(:mod:`.resample`) -> encode. Whether each encoding streams (bytes leave with the chunk that
produced them) and what the last chunk adds:

========== ======================= ===================================================== =========
encoding   library                 streaming                                             CPU
========== ======================= ===================================================== =========
PCM16      numpy                   exact: every chunk independently usable               trivial
FLOAT32    numpy                   exact                                                 trivial
WAV        numpy                   exact; 44-byte header (unknown length) in front       trivial
MULAW/ALAW numpy (G.711)           exact; one byte per sample; 8 kHz when rate is 0     trivial
MP3        FFmpeg libmp3lame       whole MP3 frames per chunk; the last frames at finish thread
AAC        FFmpeg aac              ADTS frames per chunk; the encoder's look-ahead at end thread
OGG_OPUS   FFmpeg libopus + Ogg    one Ogg page per chunk (headers first); rest at end   thread
OGG_VORBIS libsndfile (libvorbis)  by ~4 KB Ogg page: most chunks empty                  thread
FLAC       libsndfile (libFLAC)    buffered: the whole file in the last chunk            thread
========== ======================= ===================================================== =========

The concatenation of all chunks' bytes is always one complete file or stream. "thread" encoders
set ``blocking`` so the gateway runs them off the event loop (see :mod:`.ffmpeg` and
:mod:`.sndfile` for the codec details and the reasons behind the FLAC and Vorbis choices).

PCM16 conversion is the shared :func:`tts_common.audio.float_to_pcm16` (clip, x32767, round), so
PCM16, WAV, FLAC and G.711 (which compands those values) agree sample for sample.
"""

from .base import AudioEncoder
from .ffmpeg import AacEncoder, Mp3Encoder, OggOpusEncoder
from .formats import (
    AAC_SAMPLE_RATES,
    ENCODING_NAMES,
    G711_SAMPLE_RATE,
    MAX_OUTPUT_SAMPLE_RATE,
    MAX_SPEED,
    MIN_OUTPUT_SAMPLE_RATE,
    MIN_SPEED,
    MP3_SAMPLE_RATES,
    NATIVE_SAMPLE_RATE,
    OPUS_SAMPLE_RATES,
    check_output_format,
    check_speed,
    default_sample_rate,
)
from .output import AudioOutput, create_encoder
from .pcm import Float32Encoder, G711Encoder, Pcm16Encoder, WavEncoder
from .resample import StreamResampler
from .sndfile import SoundFileEncoder
from .tempo import StreamTempo

__all__ = [
    "AAC_SAMPLE_RATES",
    "AacEncoder",
    "AudioEncoder",
    "AudioOutput",
    "ENCODING_NAMES",
    "Float32Encoder",
    "G711Encoder",
    "G711_SAMPLE_RATE",
    "MAX_OUTPUT_SAMPLE_RATE",
    "MAX_SPEED",
    "MIN_OUTPUT_SAMPLE_RATE",
    "MIN_SPEED",
    "MP3_SAMPLE_RATES",
    "Mp3Encoder",
    "NATIVE_SAMPLE_RATE",
    "OPUS_SAMPLE_RATES",
    "OggOpusEncoder",
    "Pcm16Encoder",
    "SoundFileEncoder",
    "StreamResampler",
    "StreamTempo",
    "WavEncoder",
    "check_output_format",
    "check_speed",
    "create_encoder",
    "default_sample_rate",
]
