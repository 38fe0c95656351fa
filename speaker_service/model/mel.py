"""Log-mel front end of the speaker encoder (ARCHITECTURE.md §10), written without librosa.

The filterbank reproduces ``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)`` with its defaults
(Slaney mel scale, Slaney area normalisation, float32 result, including librosa's rounding: the
triangular weights are stored in float32 before the float64 normalisation is applied in place).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

_F_SP = 200.0 / 3.0  # Slaney scale: linear 66.67 Hz per mel below 1 kHz
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def hz_to_mel(freqs: np.ndarray) -> np.ndarray:
    """Slaney mel scale (linear below 1 kHz, logarithmic above), float64."""
    f = np.asarray(freqs, dtype=np.float64)
    mels = f / _F_SP
    log_region = f >= _MIN_LOG_HZ
    mels = np.where(log_region, _MIN_LOG_MEL + np.log(np.maximum(f, 1e-300) / _MIN_LOG_HZ) / _LOGSTEP, mels)
    return mels


def mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`hz_to_mel`."""
    m = np.asarray(mels, dtype=np.float64)
    freqs = _F_SP * m
    return np.where(m >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL)), freqs)


def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Mel filterbank ``[n_mels, n_fft // 2 + 1]`` float32, equal to librosa's default ``filters.mel``."""
    if fmax is None:
        fmax = sample_rate / 2.0
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    mel_pts = mel_to_hz(np.linspace(hz_to_mel(np.float64(fmin)), hz_to_mel(np.float64(fmax)), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = np.subtract.outer(mel_pts, fft_freqs)
    weights = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_pts[2 : n_mels + 2] - mel_pts[:n_mels])
    weights *= enorm[:, np.newaxis]  # float64 product rounded into the float32 array, as librosa
    return weights


class LogMelSpectrogram(nn.Module):
    """Audio ``[B, samples]`` -> log-mel ``[B, frames, n_mels]``, always computed in float32.

    Reflect padding of ``(n_fft - hop) // 2`` on both sides, ``center=False`` STFT with a periodic
    Hann window, magnitude ``sqrt(re² + im² + 1e-9)``, ``log(clamp(mel, 1e-5))``.
    Holds no parameters or buffers: nothing of it is in (or expected from) a checkpoint.
    """

    def __init__(
        self,
        sample_rate: int = 24000,
        n_fft: int = 1024,
        hop_length: int = 256,
        n_mels: int = 128,
        fmin: float = 0.0,
        fmax: float | None = 12000.0,
    ) -> None:
        super().__init__()
        self.n_fft = n_fft
        self.hop_length = hop_length
        # Plain tensors cached per device rather than buffers: `module.to(torch.bfloat16)` must not
        # round the filterbank, and they must never appear in a state dict.
        self._basis = torch.from_numpy(slaney_mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax))
        self._window = torch.hann_window(n_fft, dtype=torch.float32)
        self._per_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(mel basis, window) in float32 on ``device``."""
        if device not in self._per_device:
            self._per_device[device] = (self._basis.to(device), self._window.to(device))
        return self._per_device[device]

    def min_samples(self) -> int:
        """Shortest input accepted (reflect padding needs more samples than the pad)."""
        return (self.n_fft - self.hop_length) // 2 + 1

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        if audio.dim() == 1:
            audio = audio.unsqueeze(0)
        audio = audio.float()
        basis, window = self._tables(audio.device)
        pad = (self.n_fft - self.hop_length) // 2
        if audio.shape[-1] <= pad:
            raise ValueError(
                f"audio too short for the mel front end: {audio.shape[-1]} samples (need > {pad})"
            )
        x = nn.functional.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
        spec = torch.stft(
            x,
            self.n_fft,
            hop_length=self.hop_length,
            win_length=self.n_fft,
            window=window,
            center=False,
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        mel = torch.matmul(basis, mag)
        return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)
