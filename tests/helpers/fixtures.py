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


def fixture_prompt_inputs(name: str, line: dict):
    """The ``talker_service.model.prompt.PromptInputs`` of a fixture request line (text feeding
    resolved with the official per-type default).

    Voice-clone inputs (x-vector, reference codes) come from the official outputs stored in the
    case folder, so talker tests do not depend on the speaker stage.
    """
    import numpy as np

    from talker_service.model.prompt import PromptInputs
    from tts_common.config import load_checkpoint_config
    from tts_common.pb.qwen3tts.v1 import tts_pb2
    from tts_common.synthesis.validation import default_text_feeding

    case, i = fixture_case(name, line)
    spk = ref = None
    if line.get("ref_audio"):
        spk = np.load(case / f"spk_emb_{i}.npy")
        if not line.get("x_vector_only"):
            ref = np.load(case / f"ref_code_{i}.npy")
    non_streaming = line.get("non_streaming_text")
    if non_streaming is None:
        model_type = load_checkpoint_config(CKPT_DIR / name).model.tts_model_type or ""
        non_streaming = default_text_feeding(model_type) == tts_pb2.TEXT_FEEDING_NON_STREAMING
    speaker = line.get("speaker")
    return PromptInputs(
        text=line["text"],
        non_streaming_text=non_streaming,
        language=line.get("language", "auto").lower(),
        speaker=speaker.lower() if speaker else None,
        instruct=line.get("instruct"),
        speaker_embedding=spk,
        ref_codes=ref,
        ref_text=None if line.get("x_vector_only") else line.get("ref_text"),
    )
