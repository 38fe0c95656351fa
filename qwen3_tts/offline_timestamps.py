"""Word timestamps of offline synthesis (``qwen3-tts synthesize --timestamps out.json``).

The aligner stage's model and text rules, loaded in this process (``aligner_service``), align
each segment of an :class:`~qwen3_tts.offline.OfflineResult` as the gateway has its aligner stage
align it: the segment's audio with the segment's text, then the units moved to the request's
text (character spans) and to the joined audio (times). The JSON written has the HTTP API's
``speech.audio.timestamps`` shape: ``words`` (or ``characters``), each with ``text``, ``start`` and
``end`` in seconds of the audio, ``char_start`` and ``char_end`` in code points of the text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch

from .offline import OfflineResult

Unit = Literal["word", "character"]

UNIT_KEYS: dict[str, str] = {"word": "words", "character": "characters"}
"""The JSON list of each unit kind (as the HTTP API names it)."""


@dataclass(frozen=True)
class TimedSpan:
    """One unit of the request's text and when it is heard in its audio."""

    text: str
    start: float
    """Seconds from the start of the request's audio."""
    end: float
    char_start: int
    """Its span of the request's text, in code points: ``[char_start, char_end)``."""
    char_end: int


class UtteranceAligner(Protocol):
    """What :func:`align_result` needs of an aligner (:class:`OfflineAligner`)."""

    def align(
        self, audio: np.ndarray, sample_rate: int, text: str, language: str, unit: Unit
    ) -> list[tuple[str, int, int, float, float]]: ...


class OfflineAligner:
    """An aligner checkpoint in this process (``aligner_service``'s loader, its text units and
    timestamp repair, as its stage uses them): :meth:`align` gives the units of one utterance."""

    def __init__(
        self, model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        from aligner_service.model import load_aligner

        self.model = load_aligner(model_dir, device=device, dtype=dtype)

    def align(
        self, audio: np.ndarray, sample_rate: int, text: str, language: str, unit: Unit
    ) -> list[tuple[str, int, int, float, float]]:
        """(text, char_start, char_end, start_ms, end_ms) of each unit of ``text`` in ``audio``
        (none when the text has no letter or digit); ValueError for audio the model refuses."""
        from aligner_service.model import AlignInput
        from aligner_service.text import repaired_unit_times, split_units

        units = split_units(text, language, unit)
        if not units:
            return []
        words = [u.text for u in units]
        with torch.inference_mode():
            (classes,) = self.model.predict_classes(
                [AlignInput(audio=audio, sample_rate=sample_rate, words=words)]
            )
        times = repaired_unit_times(classes, self.model.timestamp_resolution_ms, len(units))
        return [(u.text, u.char_start, u.char_end, float(s), float(e)) for u, (s, e) in zip(units, times)]


def align_result(
    aligner: UtteranceAligner,
    result: OfflineResult,
    text: str,
    sample_rate: int,
    language: str,
    unit: Unit = "word",
) -> list[TimedSpan]:
    """The units of a synthesized request: each segment aligned alone (as the gateway does),
    its units moved by the segment's offsets in the text and in the joined audio.
    ``language``: the request's, as it is (the aligner's word split reads its case and "auto")."""
    spans: list[TimedSpan] = []
    offset = 0
    for segment in result.segments:
        audio = result.wav[offset : offset + segment.num_samples]
        if audio.size:
            units = aligner.align(audio, sample_rate, text[segment.start : segment.end], language, unit)
            seconds = offset / sample_rate
            # the aligner's times come in 80 ms classes: the last can reach past the audio's end
            end_s = (offset + audio.size) / sample_rate
            for name, char_start, char_end, start_ms, end_ms in units:
                spans.append(
                    TimedSpan(
                        name,
                        min(seconds + start_ms / 1000, end_s),
                        min(seconds + end_ms / 1000, end_s),
                        segment.start + char_start,
                        segment.start + char_end,
                    )
                )
        offset += segment.num_samples
    return spans


def timestamps_document(
    spans: Sequence[TimedSpan], text: str, duration: float, unit: Unit = "word"
) -> dict[str, object]:
    """The JSON object written by ``--timestamps``."""
    return {
        "text": text,
        "duration": duration,
        UNIT_KEYS[unit]: [asdict(s) for s in spans],
    }


def write_timestamps(path: str | Path, document: dict[str, object]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, ensure_ascii=False, indent=1), encoding="utf-8")


__all__ = [
    "OfflineAligner",
    "TimedSpan",
    "align_result",
    "timestamps_document",
    "write_timestamps",
]
