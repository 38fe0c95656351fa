"""Voice-clone front end: speaker embedding + ICL reference codes from one checkpoint directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tts_common.config import CheckpointError, load_checkpoint_config

from .codec_encoder import CodecEncoder
from .speaker_encoder import SpeakerEncoder


@dataclass
class VoiceClonePrompt:
    """What the talker needs from a reference recording."""

    speaker_embedding: torch.Tensor
    """``[enc_dim]`` float32 x-vector (enc_dim = talker hidden size)."""
    ref_codes: torch.Tensor | None
    """``[frames, 16]`` int64 reference codes; None in x-vector-only mode."""


class VoiceCloneFrontEnd:
    """Speaker encoder + speech-tokenizer encoder of a Base checkpoint.

    All inputs are mono float32 waveforms at :attr:`sample_rate` (24 kHz): decode, downmix and
    resample with :func:`tts_common.audio.load_audio` first. Outputs are CPU tensors.
    """

    def __init__(self, speaker_encoder: SpeakerEncoder, codec_encoder: CodecEncoder) -> None:
        if speaker_encoder.sample_rate != codec_encoder.sample_rate:
            raise ValueError(
                f"speaker encoder rate {speaker_encoder.sample_rate} != codec encoder rate {codec_encoder.sample_rate}"
            )
        self.speaker_encoder = speaker_encoder
        self.codec_encoder = codec_encoder

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> VoiceCloneFrontEnd:
        """Load both encoders strictly from a Base checkpoint directory."""
        path = Path(path)
        cfg = load_checkpoint_config(path)
        if cfg.model.speaker_encoder is None:
            raise CheckpointError(
                f"{path} is a {cfg.model.tts_model_type!r} checkpoint: voice cloning needs a Base checkpoint"
            )
        speaker = SpeakerEncoder.from_checkpoint(path, device, dtype, config=cfg.model.speaker_encoder)
        codec = CodecEncoder.from_checkpoint(path, device, dtype)
        return cls(speaker, codec)

    @property
    def sample_rate(self) -> int:
        """Input sample rate of both encoders (24000)."""
        return self.codec_encoder.sample_rate

    @property
    def embedding_dim(self) -> int:
        return self.speaker_encoder.config.enc_dim

    @property
    def num_quantizers(self) -> int:
        return self.codec_encoder.valid_num_quantizers

    def embed(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz audio -> ``[enc_dim]`` float32 speaker embedding (CPU)."""
        return self.speaker_encoder.embed(audio).float().cpu()

    def encode_reference(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz audio -> ``[ceil(samples/1920), 16]`` int64 reference codes (CPU)."""
        return self.codec_encoder.encode(audio)

    def prompt(self, audio: np.ndarray | torch.Tensor, x_vector_only: bool = False) -> VoiceClonePrompt:
        """Both outputs for one reference; codes are skipped in x-vector-only mode."""
        codes = None if x_vector_only else self.encode_reference(audio)
        return VoiceClonePrompt(self.embed(audio), codes)
