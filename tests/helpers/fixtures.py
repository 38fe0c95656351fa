"""Paths of the tiny official-layout checkpoints and their reference outputs, and readers for them."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CKPT_DIR = FIXTURES / "ckpt"
REFERENCE_DIR = FIXTURES / "reference"
CHECKPOINT_NAMES = ["tiny_custom_voice", "tiny_custom_voice_1b7", "tiny_voice_design", "tiny_base"]


def load_requests(name: str) -> list[dict]:
    """The fixture requests of checkpoint ``name`` (``requests.jsonl``)."""
    with open(REFERENCE_DIR / name / "requests.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def fixture_case(name: str, line: dict) -> tuple[Path, int]:
    """The case folder and utterance index of a fixture request (from its ``expect.codes``)."""
    codes = Path(line["expect"]["codes"])
    index = int(codes.stem.rsplit("_", 1)[1])
    return REFERENCE_DIR / name / codes.parent, index


def fixture_synthesis_request(name: str, line: dict):
    """A ``talker_service.model.prompt.SynthesisRequest`` for a fixture request line.

    Voice-clone inputs (x-vector, reference codes) come from the official outputs stored in the
    case folder, so talker tests do not depend on the speaker stage.
    """
    import numpy as np

    from talker_service.model.prompt import SynthesisRequest

    case, i = fixture_case(name, line)
    spk = ref = None
    if line.get("ref_audio"):
        spk = np.load(case / f"spk_emb_{i}.npy")
        if not line.get("x_vector_only"):
            ref = np.load(case / f"ref_code_{i}.npy")
    return SynthesisRequest(
        text=line["text"],
        language=line.get("language", "auto"),
        speaker=line.get("speaker"),
        instruct=line.get("instruct"),
        non_streaming_text=line.get("non_streaming_text"),
        speaker_embedding=spk,
        ref_codes=ref,
        ref_text=None if line.get("x_vector_only") else line.get("ref_text"),
    )
