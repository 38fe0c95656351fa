"""Qwen3-ForcedAligner in plain ``torch.nn.Module``s, loading the released on-disk layout.

Read in the order a request flows: :mod:`.frontend` (audio to log-mel features, words to token
ids), :mod:`.audio_encoder` (features to audio embeddings), :mod:`.text_model` (the Qwen3 text
model and the timestamp classifier), :mod:`.aligner` (one batched forward pass), :mod:`.loader`.
"""

from .aligner import ForcedAligner
from .config import AlignerCheckpointError, ForcedAlignerConfig
from .frontend import AlignInput, AlignInputError, AlignPrompt
from .loader import load_aligner

__all__ = [
    "AlignInput",
    "AlignInputError",
    "AlignPrompt",
    "AlignerCheckpointError",
    "ForcedAlignerConfig",
    "ForcedAligner",
    "load_aligner",
]
