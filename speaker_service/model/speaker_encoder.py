"""ECAPA-TDNN speaker encoder without BatchNorm (ARCHITECTURE.md §10).

Parameter names equal the checkpoint keys under ``speaker_encoder.`` so the official weights load
strictly. Every Conv1d uses ``padding="same"`` with ``padding_mode="reflect"``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from tts_common.config import CheckpointError, SpeakerEncoderConfig, load_checkpoint_config
from tts_common.weights import load_module_weights

from .mel import LogMelSpectrogram

CHECKPOINT_PREFIX = "speaker_encoder."


def _conv(in_ch: int, out_ch: int, kernel_size: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    """Conv1d -> ReLU (the BatchNorm of the original ECAPA is absent)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = _conv(in_ch, out_ch, kernel_size, dilation)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.conv(x))


class Res2NetBlock(nn.Module):
    """Split channels into ``scale`` groups; group i>0 is convolved after adding group i-1's output."""

    def __init__(self, channels: int, kernel_size: int, dilation: int, scale: int) -> None:
        super().__init__()
        if channels % scale:
            raise ValueError(f"channels {channels} not divisible by res2net scale {scale}")
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(
            [TimeDelayNetBlock(width, width, kernel_size, dilation) for _ in range(scale - 1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs: list[torch.Tensor] = []
        prev: torch.Tensor | None = None
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                out = part
            elif i == 1:
                out = self.blocks[0](part)
            else:
                assert prev is not None
                out = self.blocks[i - 1](part + prev)
            outputs.append(out)
            prev = out
        return torch.cat(outputs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    """Channel gating from the time-averaged input: sigmoid(conv2(relu(conv1(mean_t x)))) * x."""

    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.relu = nn.ReLU()
        self.conv2 = _conv(se_channels, channels, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=2, keepdim=True)
        s = self.sigmoid(self.conv2(self.relu(self.conv1(s))))
        return s * x


class SERes2NetBlock(nn.Module):
    """TDNN(k1) -> Res2Net -> TDNN(k1) -> SE, plus the identity residual."""

    def __init__(
        self, channels: int, kernel_size: int, dilation: int, res2net_scale: int, se_channels: int
    ) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(channels, channels, 1)
        self.res2net_block = Res2NetBlock(channels, kernel_size, dilation, res2net_scale)
        self.tdnn2 = TimeDelayNetBlock(channels, channels, 1)
        self.se_block = SqueezeExcitationBlock(channels, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        x = self.tdnn2(self.res2net_block(self.tdnn1(x)))
        return self.se_block(x) + residual


def _statistics(x: torch.Tensor, weights: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and std over time (``weights`` sums to 1 over the last axis)."""
    mean = (weights * x).sum(dim=2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2).clamp(eps))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    """Attentive mean/std pooling with global context: ``[B, C, T]`` -> ``[B, 2C, 1]``."""

    def __init__(self, channels: int, attention_channels: int, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1)
        self.tanh = nn.Tanh()
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        # Uniform weights 1/T (the official code builds them from an all-ones length mask).
        uniform = torch.full((x.shape[0], 1, length), 1.0 / length, dtype=x.dtype, device=x.device)
        mean, std = _statistics(x, uniform, self.eps)
        context = torch.cat(
            [x, mean.unsqueeze(2).expand(-1, -1, length), std.unsqueeze(2).expand(-1, -1, length)], dim=1
        )
        attn = torch.softmax(self.conv(self.tanh(self.tdnn(context))), dim=2)
        mean, std = _statistics(x, attn, self.eps)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN x-vector extractor: 24 kHz mono audio -> ``[enc_dim]`` speaker embedding."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, dil = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        if not (len(ch) == len(ks) == len(dil)) or len(ch) < 3:
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have equal length >= 3")
        if ch[-1] != sum(ch[1:-1]):
            raise ValueError(
                f"enc_channels[-1] ({ch[-1]}) must equal sum(enc_channels[1:-1]) ({sum(ch[1:-1])})"
            )
        self.config = config
        self.blocks = nn.ModuleList([TimeDelayNetBlock(config.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(
                SERes2NetBlock(ch[i], ks[i], dil[i], config.enc_res2net_scale, config.enc_se_channels)
            )
        self.mfa = TimeDelayNetBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], config.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, config.enc_dim, 1)
        self.mel = LogMelSpectrogram(
            sample_rate=config.sample_rate, n_mels=config.mel_dim, fmax=config.sample_rate / 2
        )

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """Log-mels ``[B, frames, mel_dim]`` -> embeddings ``[B, enc_dim]``."""
        x = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor | np.ndarray) -> torch.Tensor:
        """One mono float32 waveform at ``sample_rate`` (resample first) -> ``[enc_dim]``.

        The mel front end runs in float32; the network in the module's dtype.
        """
        wav = torch.as_tensor(np.asarray(audio, dtype=np.float32) if isinstance(audio, np.ndarray) else audio)
        if wav.dim() != 1:
            raise ValueError(f"expected mono audio [samples], got shape {tuple(wav.shape)}")
        param = self.fc.weight
        mels = self.mel(wav.to(param.device))
        return self.forward(mels.to(param.dtype))[0]

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        config: SpeakerEncoderConfig | None = None,
    ) -> SpeakerEncoder:
        """Strictly load ``speaker_encoder.*`` from the checkpoint directory ``path``.

        ``config`` defaults to the directory's ``speaker_encoder_config``; a checkpoint that is not
        a Base model (no speaker encoder) raises :class:`~tts_common.config.CheckpointError`.
        """
        path = Path(path)
        if config is None:
            config = load_checkpoint_config(path).model.speaker_encoder
            if config is None:
                raise CheckpointError(f"{path} is not a Base checkpoint: it has no speaker encoder")
        model = cls(config)
        load_module_weights(model, path / "model.safetensors", CHECKPOINT_PREFIX, dtype=dtype)
        return model.to(device=device, dtype=dtype).eval()

    @classmethod
    def random_state_dict(cls, config: SpeakerEncoderConfig, seed: int = 0) -> dict[str, torch.Tensor]:
        """Randomly initialised weights (PyTorch default init, seeded; global RNG untouched) keyed
        exactly as the official ``speaker_encoder.*`` tensors, for dev checkpoints."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(config)
        return {k: v.detach().clone().contiguous() for k, v in model.checkpoint_state_dict().items()}

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """``state_dict()`` with the official ``speaker_encoder.`` prefix (dev-checkpoint maker)."""
        return {CHECKPOINT_PREFIX + k: v for k, v in self.state_dict().items()}
