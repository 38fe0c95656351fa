"""Which dtype a model stage runs in (``--dtype``), which CPU linear kernels the talker uses
(``--linear``) and whether its weights are quantized (``--quantization``).

``--dtype auto``:

* CUDA: bfloat16 when the device supports it (``torch.cuda.is_bf16_supported``: Ampere and
  later), else float32.
* CPU: by measurement, never by CPU flags alone, and per stage (:mod:`tts_common.auto_dtype`):
  each stage times its own step in both dtypes (the talker a decode frame's linears with the
  fastest kernels of each dtype, the decoder a streamed chunk, ...) and runs in bfloat16 only
  where it is faster at one row and at eight; float32 elsewhere. On a CPU without bf16
  arithmetic the talker can still gain (it is memory-bound) while the decoder loses. The
  timings are cached per CPU model and torch version, so only the first start of a machine
  measures.

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

``--quantization w8a8`` (talker on CPU, opt-in): the same int8 weights, and each row of
activations quantized on the fly to int8 with its own step (symmetric, per token), the integer
products summed exactly (our kernel on AVX-512 VNNI or AVX2; on an AVX-512 CPU without VNNI
torch's int8 GEMM gives the same bits many times slower, so use ``int8`` there: the talker logs a
warning). Lossier than
``int8``; for batches: at 8 rows it reads the weights at about the speed one row does, where the
weight-only kernels are bound by arithmetic on a CPU without AMX. Its audio difference is
reported beside ``int8``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .cpu_info import cpu_flags, cpu_has_native_bf16, cpu_model

if TYPE_CHECKING:  # torch is imported where needed: the CLI builds its parser without it
    import torch

    from .auto_dtype import StepProbe

DTYPES = ("float32", "bfloat16", "float16")
"""The concrete dtypes a stage can run in."""
DTYPE_CHOICES = ("auto", *DTYPES)
"""Values of ``--dtype``."""
LINEAR_CHOICES = ("auto", "onednn", "gemv", "torch")
"""Values of the talker's ``--linear``."""
QUANTIZATION_CHOICES = ("none", "int8", "w8a8")
"""Values of the talker's ``--quantization``."""


def resolve_dtype(
    name: str, device: str | torch.device, cpu_probe: Callable[[], StepProbe] | None = None
) -> str:
    """The concrete dtype name of ``--dtype name`` on ``device`` (``auto`` resolved; on CPU by
    timing ``cpu_probe()``, the step of the stage that runs in it, see the module docstring).
    ``cpu_probe`` is called only where ``auto`` on CPU needs it; without one there is no
    measurement to go on and ``auto`` on CPU is refused."""
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_CHOICES)})")
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu":
        if cpu_probe is None:
            raise ValueError("--dtype auto on CPU is measured on a stage's own step: no step given")
        from .auto_dtype import measured_cpu_dtype

        return measured_cpu_dtype(cpu_probe())
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
