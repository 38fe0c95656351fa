"""Voice-clone front-end models: mel + ECAPA speaker encoder, Mimi speech-tokenizer encoder."""

from .codec_encoder import CodecEncoder
from .frontend import VoiceCloneFrontEnd, VoiceClonePrompt
from .mel import LogMelSpectrogram, slaney_mel_filterbank
from .speaker_encoder import SpeakerEncoder

__all__ = [
    "CodecEncoder",
    "LogMelSpectrogram",
    "SpeakerEncoder",
    "VoiceCloneFrontEnd",
    "VoiceClonePrompt",
    "slaney_mel_filterbank",
]
