"""Which dtype a model stage runs in (``--dtype``), which CPU linear kernels the talker uses
(``--linear``) and whether its weights are quantized (``--quantization``).

``--dtype auto``:

* CUDA: bfloat16 when the device supports it (``torch.cuda.is_bf16_supported``: Ampere and
  later), else float32.
* CPU: by measurement, never by CPU flags alone
  (:func:`tts_common.kernels.choice.measured_cpu_dtype`): bfloat16 where the linears of a
  decode frame, with the fastest kernels of each dtype, run faster in bfloat16 than in float32
  at one row and at eight; float32 elsewhere. The timings are cached per CPU model and torch
  version, so only the first start of a machine measures.

float32 keeps token parity with the official implementation. bfloat16 rounds the talker's
weights and activations, so its codes are not the official float32 ones (the same model at a
lower precision, not a bit-exact reproduction), and changes the decoder's audio within the
tolerance stated in ``decoder_service/model/loading.py``.

``--linear`` (talker on CPU): ``auto`` times every candidate kernel of the model's dtype on each
of its linear shapes at each batch bucket and keeps the fastest per shape
(:mod:`tts_common.kernels.choice`); ``onednn``, ``gemv`` (ours) or ``torch`` force one (``torch``
leaves torch's ``nn.Linear``, the reference numerics).

``--quantization int8`` (talker on CPU, opt-in): weight-only int8 with per-output-channel scales
for the talker and the code predictor (:mod:`tts_common.kernels.candidates`); activations stay in
float32. Its codes are not the float32 ones; the audio difference is reported by
``tests/unit/talker/test_quantization.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cpu_info import cpu_flags, cpu_has_native_bf16, cpu_model

if TYPE_CHECKING:  # torch is imported where needed: the CLI builds its parser without it
    import torch

DTYPES = ("float32", "bfloat16", "float16")
"""The concrete dtypes a stage can run in."""
DTYPE_CHOICES = ("auto", *DTYPES)
"""Values of ``--dtype``."""
LINEAR_CHOICES = ("auto", "onednn", "gemv", "torch")
"""Values of the talker's ``--linear``."""
QUANTIZATION_CHOICES = ("none", "int8")
"""Values of the talker's ``--quantization``."""


def resolve_dtype(name: str, device: str | torch.device) -> str:
    """The concrete dtype name of ``--dtype name`` on ``device`` (``auto`` resolved; on CPU by
    measurement, see the module docstring)."""
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_CHOICES)})")
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu":
        from .kernels.choice import measured_cpu_dtype

        return measured_cpu_dtype()
    return "float32"


__all__ = [
    "DTYPES",
    "DTYPE_CHOICES",
    "LINEAR_CHOICES",
    "QUANTIZATION_CHOICES",
    "cpu_flags",
    "cpu_has_native_bf16",
    "cpu_model",
    "resolve_dtype",
]
