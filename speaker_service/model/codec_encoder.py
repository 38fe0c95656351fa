"""Speech-tokenizer encoder: 24 kHz audio -> 12.5 Hz reference codes for ICL voice cloning.

ARCHITECTURE.md §9.2: the official encoder is ``transformers.MimiModel`` with its decoder half
(``upsample``, ``decoder_transformer``, ``decoder``) removed, weights under ``encoder.`` in
``speech_tokenizer/model.safetensors``. We reuse ``MimiModel`` the same way, so the checkpoint's
``encoder.*`` keys load strictly into the remaining submodules.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import MimiConfig, MimiModel

from tts_common.config import load_checkpoint_config
from tts_common.weights import load_module_weights

CHECKPOINT_PREFIX = "encoder."
_DECODER_HALF = ("upsample", "decoder_transformer", "decoder")


def _skip_init() -> contextlib.AbstractContextManager[Any]:
    """Skip random initialisation when every weight is loaded afterwards (10x faster at release size)."""
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:  # pragma: no cover - older/newer transformers
        return contextlib.nullcontext()
    return no_init_weights()


class MimiEncoderModel(MimiModel):
    """``MimiModel`` without its decoder half: state-dict keys equal the checkpoint's ``encoder.*``."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__(config)
        for name in _DECODER_HALF:
            delattr(self, name)


def _codebooks(model: nn.Module) -> Iterator[nn.Module]:
    for module in model.modules():
        if hasattr(module, "embed_sum") and hasattr(module, "_embed"):
            yield module


def build_mimi_config(encoder_config: dict[str, Any]) -> MimiConfig:
    """``MimiConfig`` from the raw ``encoder_config`` dict of ``speech_tokenizer/config.json``."""
    return MimiConfig(**encoder_config)


class CodecEncoder(nn.Module):
    """Mono 24 kHz float32 audio -> ``[frames, valid_num_quantizers]`` int64 codes (12.5 Hz)."""

    def __init__(
        self,
        encoder_config: dict[str, Any],
        valid_num_quantizers: int = 16,
        downsample_rate: int = 1920,
        sample_rate: int = 24000,
    ) -> None:
        super().__init__()
        self.mimi = MimiEncoderModel(build_mimi_config(encoder_config))
        if valid_num_quantizers > self.mimi.config.num_quantizers:
            raise ValueError(
                f"encoder_valid_num_quantizers {valid_num_quantizers} > Mimi num_quantizers "
                f"{self.mimi.config.num_quantizers}"
            )
        self.valid_num_quantizers = valid_num_quantizers
        self.downsample_rate = downsample_rate
        self.sample_rate = sample_rate

    def _apply(self, fn: Any, recurse: bool = True) -> CodecEncoder:
        # Mimi caches `embed_sum / cluster_usage` on first use; drop it whenever tensors move/cast.
        super()._apply(fn, recurse)
        self.reset_codebook_cache()
        return self

    def reset_codebook_cache(self) -> None:
        """Forget Mimi's lazily computed codebook embeddings (after loading or casting)."""
        for codebook in _codebooks(self.mimi):
            codebook._embed = None

    def num_frames(self, num_samples: int) -> int:
        """Frames kept for ``num_samples`` input samples: ``ceil(num_samples / 1920)``."""
        return math.ceil(num_samples / self.downsample_rate)

    @torch.inference_mode()
    def encode_batch(self, audios: Sequence[torch.Tensor | np.ndarray]) -> list[torch.Tensor]:
        """Encode several waveforms as the official batch path does.

        They are right-padded with zeros to the longest (no padding mask reaches Mimi), encoded
        together, and each result is cut to ``ceil(len / 1920)`` frames. Returns CPU int64
        ``[frames, valid_num_quantizers]`` tensors.
        """
        if not audios:
            return []
        param = next(self.mimi.parameters())
        wavs = [
            torch.as_tensor(np.asarray(a, dtype=np.float32)) if isinstance(a, np.ndarray) else a
            for a in audios
        ]
        for w in wavs:
            if w.dim() != 1 or w.numel() == 0:
                raise ValueError(f"expected non-empty mono audio [samples], got shape {tuple(w.shape)}")
        longest = max(w.numel() for w in wavs)
        batch = torch.zeros(len(wavs), 1, longest, dtype=torch.float32)
        for i, w in enumerate(wavs):
            batch[i, 0, : w.numel()] = w.detach().float().cpu()
        # Asking Mimi for only the kept quantizers gives the same codes as encoding all of them
        # and slicing (residual VQ layers depend only on earlier layers), at half the RVQ cost.
        out = self.mimi.encode(
            batch.to(device=param.device, dtype=param.dtype),
            num_quantizers=self.valid_num_quantizers,
            return_dict=True,
        )
        codes = out.audio_codes[:, : self.valid_num_quantizers]  # [B, K, T]
        return [
            codes[i, :, : self.num_frames(w.numel())].transpose(0, 1).to("cpu", torch.int64)
            for i, w in enumerate(wavs)
        ]

    def encode(self, audio: torch.Tensor | np.ndarray) -> torch.Tensor:
        """One mono waveform at 24 kHz -> ``[ceil(samples/1920), valid_num_quantizers]`` int64."""
        return self.encode_batch([audio])[0]

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> CodecEncoder:
        """Strictly load ``speech_tokenizer/model.safetensors`` (``encoder.*``) of checkpoint dir ``path``."""
        path = Path(path)
        st = load_checkpoint_config(path).speech_tokenizer
        with _skip_init():
            model = cls(
                st.encoder_config,
                st.encoder_valid_num_quantizers,
                st.encode_downsample_rate,
                st.input_sample_rate,
            )
        load_module_weights(model.mimi, path / "speech_tokenizer" / "model.safetensors", CHECKPOINT_PREFIX)
        return model.to(device=device, dtype=dtype).eval()

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights keyed exactly as in the official ``speech_tokenizer/model.safetensors``."""
        return {CHECKPOINT_PREFIX + k: v for k, v in self.mimi.state_dict().items()}

    @classmethod
    def random_state_dict(
        cls, encoder_config: dict[str, Any], seed: int = 0, calibration_seconds: float = 8.0
    ) -> dict[str, torch.Tensor]:
        """A random encoder with official key names (``encoder.*``), for dev checkpoints.

        Network weights use Mimi's own initialisation (seeded, global RNG untouched). Codebooks
        (all zero at init, which would make every code 0) are calibrated on a deterministic
        synthetic signal: layer by layer, entries are drawn from a Gaussian with the per-dimension
        mean/std of the current residual, so that codes vary and residual norms shrink as in a
        trained RVQ.
        """
        config = build_mimi_config(encoder_config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            mimi = MimiEncoderModel(config).eval()
        gen = torch.Generator().manual_seed(seed + 1)
        signal = _calibration_signal(config.sampling_rate, calibration_seconds, seed)
        with torch.no_grad():
            _calibrate_codebooks(mimi, signal, gen)
        return {CHECKPOINT_PREFIX + k: v.detach().clone().contiguous() for k, v in mimi.state_dict().items()}


def _calibration_signal(sample_rate: int, seconds: float, seed: int) -> torch.Tensor:
    """Deterministic speech-like test signal: gliding harmonics with an envelope, plus noise."""
    rng = np.random.default_rng(seed)
    n = int(sample_rate * seconds)
    t = np.arange(n) / sample_rate
    f0 = (
        120.0
        + 60.0 * np.sin(2 * np.pi * 0.7 * t)
        + 20.0 * rng.standard_normal() * np.sin(2 * np.pi * 3.1 * t)
    )
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 2.3 * t) ** 2
    x = 0.15 * envelope * voiced + 0.02 * rng.standard_normal(n)
    return torch.from_numpy(x.astype(np.float32)).view(1, 1, -1)


def _calibrate_codebooks(mimi: MimiModel, signal: torch.Tensor, gen: torch.Generator) -> None:
    """Fill every RVQ codebook (``embed_sum``, ``cluster_usage`` = 1) from residual statistics."""
    emb = mimi.encoder(signal)
    emb = mimi.encoder_transformer(emb.transpose(1, 2), return_dict=True)[0].transpose(1, 2)
    emb = mimi.downsample(emb)  # [1, hidden, frames]
    quantizer = mimi.quantizer
    for rvq in (quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer):
        x = rvq.input_proj(emb) if rvq.input_proj is not None else emb
        residual = x[0].transpose(0, 1).float()  # [frames, dim]
        for layer in rvq.layers:
            book = layer.codebook
            size, dim = book.embed_sum.shape
            mean, std = residual.mean(0), residual.std(0).clamp(min=1e-6)
            entries = mean + std * torch.randn(size, dim, generator=gen)
            book.embed_sum.copy_(entries)
            book.cluster_usage.fill_(1.0)
            book.initialized.fill_(1.0)
            book._embed = None
            nearest = torch.cdist(residual, entries).argmin(-1)
            residual = residual - entries[nearest]
