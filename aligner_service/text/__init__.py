"""The aligner's text side, in the order a request flows: the text is cut into timing units with
their code-point spans (:mod:`.units`, using :mod:`.japanese` and :mod:`.korean` for those
languages, over the pieces of :mod:`.pieces`), and the model's raw timestamps are repaired (:mod:`.repair`).

The rules are the official ``Qwen3ForceAlignProcessor``'s (qwen-asr 0.0.6), reimplemented; the
tests pin them against fixtures the official code produced (``scripts/aligner_text_fixtures.py``).
"""

from .repair import repair_timestamps, repaired_unit_times
from .units import Unit, UnitMode, split_units

__all__ = ["Unit", "UnitMode", "repair_timestamps", "repaired_unit_times", "split_units"]
