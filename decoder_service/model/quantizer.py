"""The decoder's split residual vector quantizer (decode only: codes -> embeddings).

Buffer and parameter names equal the checkpoint keys (``quantizer.*``); it acts per time step,
so it needs no streaming state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .primitives import DerivedCache


class EuclideanCodebook(nn.Module):
    """One VQ codebook: entry = ``embedding_sum / clamp(cluster_usage, 1e-5)``."""

    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.register_buffer("cluster_usage", torch.ones(codebook_size))
        self.register_buffer("embedding_sum", torch.zeros(codebook_size, dim))
        self._cache = DerivedCache()

    def table(self) -> Tensor:
        """The [codebook_size, dim] embedding table (cached until the buffers change)."""
        return self._cache.get(
            (self.embedding_sum, self.cluster_usage),
            lambda: self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None],
        )


class _VQLayer(nn.Module):
    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size)


class _VQLayers(nn.Module):
    def __init__(self, n: int, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQLayer(dim, codebook_size) for _ in range(n)])


class ResidualVectorQuantizer(nn.Module):
    """``n`` codebooks of dim ``codebook_dim/2``; decode = sum of entries -> output_proj (k1)."""

    def __init__(self, n_q: int, codebook_dim: int, codebook_size: int) -> None:
        super().__init__()
        half = codebook_dim // 2
        # input_proj is only used to encode; kept so the checkpoint loads strictly.
        self.input_proj = nn.Conv1d(codebook_dim, half, 1, bias=False)
        self.output_proj = nn.Conv1d(half, codebook_dim, 1, bias=False)
        self.vq = _VQLayers(n_q, half, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, n_q, T] -> [B, codebook_dim, T]."""
        quantized: Tensor | None = None
        for i, layer in enumerate(self.vq.layers):
            emb = F.embedding(codes[:, i], layer._codebook.table())  # [B, T, half]
            quantized = emb if quantized is None else quantized + emb
        assert quantized is not None
        return self.output_proj(quantized.transpose(1, 2))


class SplitResidualVectorQuantizer(nn.Module):
    """Codebook 0 through ``rvq_first``, codebooks 1.. through ``rvq_rest``; outputs added."""

    def __init__(self, num_quantizers: int, codebook_dim: int, codebook_size: int) -> None:
        super().__init__()
        self.rvq_first = ResidualVectorQuantizer(1, codebook_dim, codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(num_quantizers - 1, codebook_dim, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, num_quantizers, T] (all >= 0) -> [B, codebook_dim, T]."""
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
