"""Loading a Qwen3-ForcedAligner checkpoint in the released layout (ARCHITECTURE.md §12).

A checkpoint folder holds ``config.json`` (``thinker_config.model_type`` ``qwen3_forced_aligner``),
``model.safetensors`` (bf16 in the release; keys ``thinker.audio_tower.*``, ``thinker.model.*``,
``thinker.lm_head.weight``), ``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` (with the
audio tokens under ``extra_special_tokens``) and ``preprocessor_config.json`` (Whisper features).
``generation_config.json`` and ``chat_template.json`` are not read.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tts_common.weights import load_prefixed_state_dict

from .aligner import ForcedAligner
from .config import AlignerCheckpointError, ForcedAlignerConfig
from .frontend import AlignerFrontend
from .text_model import AlignerThinker

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_PREFIX = "thinker."


def load_aligner(
    path: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> ForcedAligner:
    """Load the aligner checkpoint in folder ``path`` onto ``device`` in ``dtype``.

    float32 (the default) runs bf16 release weights upcast, like the official loader without a
    ``dtype``; ``torch.bfloat16`` runs in bf16. Raises :class:`AlignerCheckpointError` for a
    folder that is not a loadable aligner checkpoint.
    """
    root = Path(path)
    if not root.is_dir():
        raise AlignerCheckpointError(f"aligner checkpoint folder {root} does not exist")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise AlignerCheckpointError(f"unsupported dtype {dtype}")
    config = ForcedAlignerConfig.from_checkpoint(root)
    frontend = AlignerFrontend.from_checkpoint(root, config)
    weights = root / WEIGHTS_FILE
    if not weights.is_file():
        raise AlignerCheckpointError(f"no {WEIGHTS_FILE} in {root}")
    state = load_prefixed_state_dict(weights, WEIGHTS_PREFIX, dtype=dtype)
    with torch.device("meta"):
        thinker = AlignerThinker(config)
    try:
        missing, unexpected = thinker.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # shape mismatches
        raise AlignerCheckpointError(f"{weights}: {exc}") from exc
    if missing or unexpected:
        raise AlignerCheckpointError(
            f"{weights}: missing keys {sorted(missing)[:10]}, unexpected keys {sorted(unexpected)[:10]}"
        )
    thinker = thinker.to(device=torch.device(device), dtype=dtype)
    return ForcedAligner(thinker, frontend, model_name=root.resolve().name)
