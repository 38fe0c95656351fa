"""Loading tensors from the official safetensors files."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def load_prefixed_state_dict(
    path: str | Path,
    prefix: str,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Tensors of ``path`` whose key starts with ``prefix``, with the prefix removed.

    ``dtype`` converts floating tensors (released weights are bf16; we run in float32 unless
    bfloat16 is asked for, like the official loader with no ``dtype``).
    """
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt", device=str(device)) as fh:
        for key in fh.keys():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            tensor = fh.get_tensor(key)
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            out[name] = tensor
    return out


def load_module_weights(
    module: torch.nn.Module,
    path: str | Path,
    prefix: str,
    dtype: torch.dtype | None = None,
) -> None:
    """Load ``prefix``-ed tensors of ``path`` into ``module``; missing or unexpected keys raise.

    ``dtype``: as in :func:`load_prefixed_state_dict`; the tensors are then copied into the
    module's own parameters, in their dtypes (so without ``dtype`` each stored tensor is rounded
    once, to its parameter's dtype). Buffers that are not persistent
    (RoPE tables, caches) are not expected in the file.
    """
    state = load_prefixed_state_dict(path, prefix, dtype=dtype)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path} ({prefix}*): missing keys {sorted(missing)[:10]}, unexpected keys {sorted(unexpected)[:10]}"
        )
