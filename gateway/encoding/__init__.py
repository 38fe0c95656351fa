"""Streaming output encoders: float32 24 kHz PCM chunks in, encoded ``AudioChunk`` bytes out.

Per request an :class:`AudioOutput` runs time-scale (``speed``, :mod:`.tempo`) -> resample
(:mod:`.resample`) -> encode. Whether each encoding streams (bytes leave with the chunk that
produced them) and what the last chunk adds:

=========== ========================== =============================================== =====
encoding    library                    streaming                                       CPU
=========== ========================== =============================================== =====
PCM16       numpy                      exact: every chunk usable on its own            0.06
FLOAT32     numpy                      exact                                           0.01
WAV         numpy                      exact; header (unknown length) in front         0.06
MULAW/ALAW  numpy (G.711)              exact; one byte a sample; 8 kHz when rate is 0  0.6
MP3         FFmpeg libmp3lame          MP3 frames per chunk; the rest at finish()      17
AAC         FFmpeg aac                 ADTS frames per chunk; the rest at finish()     8
OGG_OPUS    FFmpeg libopus + .ogg      one Ogg page per chunk (headers first)          7
OGG_VORBIS  libsndfile (libvorbis)     by ~4 KB Ogg page: most chunks carry nothing    4
FLAC        libsndfile (libFLAC)       buffered: the whole file in the last chunk      0.7
=========== ========================== =============================================== =====

CPU: milliseconds per second of 24 kHz audio on one x86-64 core (320 ms chunks, the dev
machine); the speed stage adds 0.7-5.5 (most at 0.25), resampling 0.1-0.2. The concatenation of
all chunks' bytes is always one complete file or stream. Encoders that cost real CPU set
``blocking`` (MP3, AAC, Ogg, FLAC), and so does an :class:`AudioOutput` with a speed or resampling
stage, so the gateway runs them off the event loop. :mod:`.ffmpeg` and :mod:`.sndfile` give the
codec details and why FLAC is buffered and Vorbis stays on libsndfile.

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
