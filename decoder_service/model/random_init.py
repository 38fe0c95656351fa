"""Deterministic random decoder weights — DEV ONLY, never for serving.

For unit tests and benchmarks that need a decoder without a checkpoint (e.g. at the released
dimensions, ``bench/decoder_bench.py``). The weights are noise: the audio is meaningless. Serving
loads real weights with ``loading.load_codec_decoder``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tts_common.layers import RMSNorm

from .convolutions import ConvNeXtBlock, ResidualUnit, SnakeBeta
from .decoder import CodecDecoder
from .quantizer import EuclideanCodebook
from .transformer import LayerScale


def init_random_weights(decoder: CodecDecoder, seed: int = 0, scale: float = 1.0) -> CodecDecoder:
    """Fill ``decoder`` with deterministic random weights (dev only: tests, benchmarks).

    Fan-in scaled so activations stay O(1) through the whole chain and the output is not clamped
    everywhere; residual scales (LayerScale, ConvNeXt gamma) are made large enough that every path
    matters numerically.
    """
    gen = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size, std: float) -> Tensor:
        return torch.randn(shape, generator=gen) * std

    with torch.no_grad():
        for module in decoder.modules():
            if isinstance(module, nn.ConvTranspose1d):
                # weight [in, out, k]: each output sample sums in * k / stride products
                w = module.weight
                fan_in = w.shape[0] * w.shape[2] // module.stride[0]
                w.copy_(normal(w.shape, scale / math.sqrt(fan_in)))
            elif isinstance(module, (nn.Conv1d, nn.Linear)):
                w = module.weight
                w.copy_(normal(w.shape, scale / math.sqrt(w[0].numel())))
            elif isinstance(module, (RMSNorm, nn.LayerNorm)):
                module.weight.copy_(1.0 + normal(module.weight.shape, 0.1))
            elif isinstance(module, SnakeBeta):
                module.alpha.copy_(normal(module.alpha.shape, 0.3))
                module.beta.copy_(normal(module.beta.shape, 0.3))
            elif isinstance(module, LayerScale):
                module.scale.copy_(normal(module.scale.shape, 0.1).abs())
            elif isinstance(module, ConvNeXtBlock):
                module.gamma.copy_(normal(module.gamma.shape, 0.1).abs())
            elif isinstance(module, EuclideanCodebook):
                usage = torch.rand(module.cluster_usage.shape, generator=gen) * 2 + 0.5
                module.cluster_usage.copy_(usage)
                # entries ~ N(0, 1/num_quantizers) so the sum over codebooks is O(1)
                std = 1.0 / math.sqrt(decoder.num_quantizers)
                module.embedding_sum.copy_(normal(module.embedding_sum.shape, std) * usage[:, None])
            bias = getattr(module, "bias", None)
            if (
                isinstance(module, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear, nn.LayerNorm))
                and bias is not None
            ):
                bias.copy_(normal(bias.shape, 0.02))
        # residual units: a small residual branch keeps the activation scale flat across blocks
        for module in decoder.modules():
            if isinstance(module, ResidualUnit):
                module.conv2.conv.weight.mul_(0.3)
        # keep the output in a sensible range so little is clamped
        decoder.decoder[-1].conv.weight.mul_(0.15)
    return decoder
