"""Which dtype a model stage runs in (``--dtype``) and which CPU linear kernels the talker uses
(``--linear``), chosen from what the machine multiplies fast.

``--dtype auto``: bfloat16 where the hardware multiplies bfloat16 natively, float32 elsewhere.

* CUDA: bfloat16 when the device supports it (``torch.cuda.is_bf16_supported``: Ampere and
  later).
* CPU: bfloat16 when the CPU has bfloat16 dot-product instructions: x86 ``avx512_bf16`` or
  ``amx_bf16``, Arm ``bf16`` (``/proc/cpuinfo`` flags; torch's ``get_cpu_capability`` names the
  vector width only). Without them torch emulates bfloat16 by converting to float32 around every
  kernel: half the weight bytes but more work per byte, so the gain is not assured, while float32
  is exact.

float32 keeps token parity with the official implementation. bfloat16 rounds the talker's
weights and activations, so its codes are not the official float32 ones (the same model at a
lower precision, not a bit-exact reproduction), and changes the decoder's audio within the
tolerance stated in ``decoder_service/model/loading.py``.

``--linear auto`` (talker on CPU in float32): pre-packed oneDNN linears
(:mod:`tts_common.onednn_linear`) or torch's. oneDNN wins at every batch on AVX2/AVX-512 CPUs
without AMX (the dev EPYC: ~2x at 1 row, ~2.8x at 16); on CPUs with AMX, torch's linears win at
one stream (376 vs 315 ms per frame on a Xeon) and oneDNN from about 8 streams (25.9 vs 18.4
frames/s at 16). The kernel cannot change with each step's batch (a request's codes must not
depend on its batch), so ``auto`` picks by the machine and the engine's slot count: oneDNN unless
the CPU has AMX and the engine runs fewer than :data:`AMX_ONEDNN_MIN_SLOTS` slots.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where needed: the CLI builds its parser without it
    import torch

DTYPES = ("float32", "bfloat16", "float16")
"""The concrete dtypes a stage can run in."""
DTYPE_CHOICES = ("auto", *DTYPES)
"""Values of ``--dtype``."""
LINEAR_CHOICES = ("auto", "onednn", "torch")
"""Values of the talker's ``--linear``."""
AMX_ONEDNN_MIN_SLOTS = 8
"""On an AMX CPU, the engine slot count from which the packed oneDNN linears are chosen."""


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (x86 ``flags``, Arm
    ``Features``); empty when unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``"unknown"`` when unreadable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return "unknown"


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 natively (see the module docstring)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_amx(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU has AMX tile matrix units."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"amx_bf16", "amx_tile", "amx_int8"})


def resolve_dtype(name: str, device: str | torch.device, *, flags: frozenset[str] | None = None) -> str:
    """The concrete dtype name of ``--dtype name`` on ``device`` (``auto`` resolved)."""
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPE_CHOICES)})")
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu":
        return "bfloat16" if cpu_has_native_bf16(flags) else "float32"
    return "float32"


def use_onednn_linears_for(
    choice: str,
    device: str | torch.device,
    dtype: torch.dtype,
    slots: int,
    *,
    flags: frozenset[str] | None = None,
) -> bool:
    """Whether the talker runs its linears as pre-packed oneDNN ones (``--linear choice``; see
    the module docstring). Only CPU float32 models can; elsewhere always False."""
    if choice not in LINEAR_CHOICES:
        raise ValueError(f"unknown linear kernels {choice!r} (choose from {', '.join(LINEAR_CHOICES)})")
    import torch

    if torch.device(device).type != "cpu" or dtype != torch.float32 or choice == "torch":
        return False
    if choice == "onednn":
        return True
    return not cpu_has_amx(flags) or slots >= AMX_ONEDNN_MIN_SLOTS


__all__ = [
    "AMX_ONEDNN_MIN_SLOTS",
    "DTYPES",
    "DTYPE_CHOICES",
    "LINEAR_CHOICES",
    "cpu_flags",
    "cpu_has_amx",
    "cpu_has_native_bf16",
    "cpu_model",
    "resolve_dtype",
    "use_onednn_linears_for",
]
