"""Shared pieces of the decoder's modules: the streaming-state protocol and small tensor helpers.

Every stateful module of the decoder (``Stateful``) has two entry points:

* ``forward(x)`` — whole-utterance computation with the official padding rules (the reference
  path, checked against the official outputs in the fixtures);
* ``step(x, lengths, state, new_state)`` — incremental computation for streaming. Every op of the
  network is causal (stride-1 convs pad only on the left, transposed convs trim only on the right,
  attention is causal with a sliding window), so a step needs only *past* context, held in a small
  fixed-size state per stream; no output sample is ever held back. Feeding frames in any chunking
  yields the samples of the whole-utterance decode of those frames (up to float rounding).

Batched steps advance many streams at once: each row of a batch holds one stream, rows are
right-padded to the longest chunk, ``lengths`` gives each row's valid length at the module's
time resolution (``None`` = every row fully valid) and every state is re-extracted at the row's
own valid end (``gather_time``). Padded positions only influence padded outputs (everything is
causal), except where noted (transposed-conv overlap: padded inputs are zeroed first).

State tensors all have a fixed shape (batch first) that does not depend on the stream position,
which keeps batched steps static-shape friendly (CUDA graphs, see ``cuda_graphs.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

State = dict[str, Tensor]
"""Streaming state of a batch of streams: state key (module path, plus a suffix) -> tensor whose
first dimension is the batch."""


def gather_time(x: Tensor, start: Tensor | None, size: int, dim: int = -1) -> Tensor:
    """``x[b, ..., start[b] : start[b] + size, ...]`` along ``dim`` for every row ``b``.

    ``start=None`` means "the last ``size`` steps" for every row (the fast, all-rows-full case).
    """
    dim = dim % x.dim()
    if start is None:
        return x.narrow(dim, x.shape[dim] - size, size)
    idx = start[:, None] + torch.arange(size, device=x.device)  # [B, size]
    view = [x.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = size
    idx = idx.view(view).expand(*[size if d == dim else s for d, s in enumerate(x.shape)])
    return torch.gather(x, dim, idx)


def zero_padding(x: Tensor, lengths: Tensor) -> Tensor:
    """``x`` [B, C, T] with every step ``t >= lengths[b]`` of row ``b`` set to 0."""
    t = torch.arange(x.shape[-1], device=x.device)
    return torch.where(
        (t[None, :] < lengths[:, None])[:, None, :], x, torch.zeros((), dtype=x.dtype, device=x.device)
    )


class DerivedCache:
    """A tensor derived from parameters/buffers, recomputed only when they change.

    In-place updates (``load_state_dict``) bump a tensor's ``_version`` and ``.to()`` changes its
    storage, so (data_ptr, _version) identifies the sources' contents. Not cached while autograd
    is recording (the cached value must not carry a graph).
    """

    def __init__(self) -> None:
        self._key: Any = None
        self._value: Tensor | None = None

    def get(self, sources: tuple[Tensor, ...], compute: Callable[[], Tensor]) -> Tensor:
        """The cached ``compute()``, recomputed when any of ``sources`` changed since the last call."""
        if torch.is_grad_enabled():
            return compute()
        try:
            key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in sources)
        except RuntimeError:  # inference tensors track no version
            return compute()
        if self._value is None or key != self._key:
            self._value, self._key = compute(), key
        return self._value


class Stateful(nn.Module):
    """A module that keeps streaming state; ``state_key`` is set to its module path."""

    state_key: str = ""

    def state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
        """State entries: key -> (shape without batch, dtype; None = the model's float dtype)."""
        raise NotImplementedError
