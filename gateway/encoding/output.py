"""The per-request output chain: time-scale -> resample -> encode."""

from __future__ import annotations

import numpy as np

from tts_common.pb.qwen3tts.v1 import tts_pb2

from .base import AudioEncoder
from .ffmpeg import AacEncoder, Mp3Encoder, OggOpusEncoder
from .formats import NATIVE_SAMPLE_RATE, check_output_format, check_speed
from .pcm import Float32Encoder, G711Encoder, Pcm16Encoder, WavEncoder
from .resample import StreamResampler, resampled_length
from .sndfile import SOUNDFILE_FORMATS, SoundFileEncoder
from .tempo import StreamTempo, time_scaled_length


def create_encoder(encoding: int, sample_rate: int) -> AudioEncoder:
    """The encoder for a resolved (never UNSPECIFIED) encoding; InvalidRequestError if it
    cannot be produced at ``sample_rate``."""
    check_output_format(encoding, sample_rate)
    if encoding == tts_pb2.AUDIO_ENCODING_PCM16:
        return Pcm16Encoder()
    if encoding == tts_pb2.AUDIO_ENCODING_FLOAT32:
        return Float32Encoder()
    if encoding == tts_pb2.AUDIO_ENCODING_WAV:
        return WavEncoder(sample_rate)
    if encoding == tts_pb2.AUDIO_ENCODING_MULAW:
        return G711Encoder("mulaw")
    if encoding == tts_pb2.AUDIO_ENCODING_ALAW:
        return G711Encoder("alaw")
    if encoding == tts_pb2.AUDIO_ENCODING_MP3:
        return Mp3Encoder(sample_rate)
    if encoding == tts_pb2.AUDIO_ENCODING_AAC:
        return AacEncoder(sample_rate)
    if encoding == tts_pb2.AUDIO_ENCODING_OGG_OPUS:
        return OggOpusEncoder(sample_rate)
    assert encoding in SOUNDFILE_FORMATS, encoding
    return SoundFileEncoder(encoding, sample_rate)


class AudioOutput:
    """Time-scaling (``speed`` != 1), resampling (output rate != input rate), then the encoder.

    Time-scaling runs at the input rate, before resampling, so the resampler's exact-length
    guarantee holds for the output rate. ``speed`` 1.0 skips the stage entirely (bit-identical).
    Both stages have exact lengths, so the whole output of ``n`` input samples is
    :meth:`output_length` ``(n)`` samples, and never more before the end.
    """

    def __init__(
        self,
        encoding: int,
        sample_rate: int,
        input_sample_rate: int = NATIVE_SAMPLE_RATE,
        speed: float = 1.0,
    ) -> None:
        check_speed(speed)
        self.encoding = encoding
        self.sample_rate = sample_rate
        self.input_sample_rate = input_sample_rate
        self.speed = speed
        self.encoder = create_encoder(encoding, sample_rate)
        self.tempo = StreamTempo(speed, input_sample_rate) if speed != 1.0 else None
        self.resampler = (
            StreamResampler(input_sample_rate, sample_rate) if sample_rate != input_sample_rate else None
        )

    def output_length(self, input_samples: int) -> int:
        """The output samples ``input_samples`` input samples become (time-scaled, then
        resampled): where input sample ``n`` lands in the output, and the whole output's length
        once :meth:`finish` has run."""
        n = input_samples
        if self.tempo is not None:
            n = time_scaled_length(n, self.speed)
        if self.resampler is not None:
            n = resampled_length(n, self.input_sample_rate, self.sample_rate)
        return n

    @property
    def blocking(self) -> bool:
        """Whether :meth:`process` is CPU-heavy enough for a worker thread."""
        return self.tempo is not None or self.resampler is not None or self.encoder.blocking

    def process(self, samples: np.ndarray) -> tuple[bytes, int]:
        """Encoded bytes and the number of output samples for the next input chunk."""
        if self.tempo is not None:
            samples = self.tempo.process(samples)
        if self.resampler is not None:
            samples = self.resampler.process(samples)
        return self.encoder.encode(samples), int(samples.size)

    def finish(self) -> tuple[bytes, int]:
        """Everything held back (time-scale and resampler tails, encoder trailer) and its
        sample count."""
        tail = np.zeros(0, dtype=np.float32)
        if self.tempo is not None:
            tail = self.tempo.flush()
        if self.resampler is not None:
            head = self.resampler.process(tail) if tail.size else tail
            tail = np.concatenate([head, self.resampler.flush()])
        data = self.encoder.encode(tail) if tail.size else b""
        return data + self.encoder.finish(), int(tail.size)
