"""The forced aligner: a batch of (audio, words) to raw timestamp classes in one forward pass.

:class:`ForcedAligner` is what the server runs: :meth:`ForcedAligner.predict_classes` returns, per
input, ``2 * len(words)`` argmax classes (start and end of each word) at the ``<timestamp>``
positions, before any repair; class ``c`` is ``c * timestamp_resolution_ms`` milliseconds.
Batches are left-padded as the official code pads them; each utterance's features and audio
embeddings are computed alone, so a batch aligns every utterance with what it would be aligned
with alone (the text model's padded matmuls may still differ in the last bits: see
:meth:`ForcedAligner.timestamp_logits`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import ForcedAlignerConfig
from .frontend import (
    SAMPLE_RATE,
    AlignerFrontend,
    AlignInput,
    AlignInputError,
    AlignPrompt,
)
from .text_model import AlignerThinker

__all__ = ["AlignInput", "AlignInputError", "AlignPrompt", "ForcedAligner"]


class ForcedAligner:
    """A loaded Qwen3-ForcedAligner (see :func:`aligner_service.model.loader.load_aligner`)."""

    sample_rate: int = SAMPLE_RATE
    """Rate the audio is aligned at (inputs at other rates are resampled)."""

    def __init__(
        self, thinker: AlignerThinker, frontend: AlignerFrontend, *, model_name: str = "qwen3-forced-aligner"
    ) -> None:
        self.thinker = thinker.eval()
        self.frontend = frontend
        self.config: ForcedAlignerConfig = thinker.config
        self.model_name = model_name
        """Name of the checkpoint (its folder name), for model info and metrics."""
        param = next(thinker.parameters())
        self.device: torch.device = param.device
        self.dtype: torch.dtype = param.dtype
        self.max_audio_seconds: float = frontend.max_audio_seconds
        """Longest audio one input may have (180 s for the release)."""
        self.timestamp_resolution_ms: float = self.config.timestamp_segment_time
        """Milliseconds per class (``timestamp_segment_time``, 80 in the release)."""

    @property
    def num_classes(self) -> int:
        """Timestamp classes (``classify_num``): the longest time is ``(num_classes - 1) * resolution``."""
        return self.config.classify_num

    def prepare(self, item: AlignInput) -> AlignPrompt:
        """CPU-side work for one input (validation, resampling, features, token ids); raises
        :class:`AlignInputError` for unusable input."""
        return self.frontend.prepare(item)

    @torch.inference_mode()
    def logits_for_prompts(self, prompts: Sequence[AlignPrompt]) -> list[torch.Tensor]:
        """One forward pass over prepared prompts: per prompt, fp32 logits [2 * words, classes]."""
        if not prompts:
            return []
        longest = max(len(p.input_ids) for p in prompts)
        pad_id = self.frontend.audio_end_id  # any id: padded positions are masked out and never read
        ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, longest - len(p.input_ids) :] = torch.tensor(p.input_ids, dtype=torch.long)
            mask[row, longest - len(p.input_ids) :] = 1
        features = [torch.from_numpy(p.features).to(self.device, self.dtype) for p in prompts]
        logits = self.thinker.timestamp_logits(ids.to(self.device), mask.to(self.device), features)
        return list(logits.float().cpu().split([2 * p.num_words for p in prompts]))

    def timestamp_logits(self, batch: Sequence[AlignInput]) -> list[torch.Tensor]:
        """Per input, fp32 logits [2 * len(words), classify_num] at its ``<timestamp>`` positions.

        Batched logits equal single-input logits up to the last bits of the text model's padded
        matmuls, so an argmax can differ from the single-input one only where the single-input top-2
        margin is of that order (a near tie).
        """
        return self.logits_for_prompts([self.prepare(item) for item in batch])

    def predict_classes(self, batch: Sequence[AlignInput]) -> list[list[int]]:
        """Per input, the ``2 * len(words)`` raw argmax classes (start, end per word), before repair."""
        return [row.argmax(dim=-1).tolist() for row in self.timestamp_logits(batch)]
