"""The decoder process's settings (:class:`DecoderConfig`) and command line: the model-stage
flags, ``--max-streams``, ``--cuda-graphs`` and the server flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from tts_common.flags import NOT_A_FLAG, config_from_args, flag, non_negative_float
from tts_common.memory import parse_size
from tts_common.self_check import CUDA_GRAPHS_CHOICES
from tts_common.stage_main import StageModelConfig, stage_flags

STAGE = "decoder"
DEFAULT_PORT = 50053
DEFAULT_GRAPH_MEMORY = 4 * 2**30
"""``--graph-memory``'s default (see :attr:`DecoderConfig.graph_memory`)."""
DEFAULT_PLAYOUT_HEADROOM_MS = 0.0
"""``--playout-headroom-ms``'s default: off. Pacing makes the chunk boundaries, and so the last
bits of the audio (float rounding, ~1e-7), depend on timing; off, a request's audio is the same
bits on every run. On a CPU host serving live listeners, 120: room for one small chunk's decode
and its wait for a batched forward with other streams (up to ~50 ms of wall time on 2 cores
shared with the talker) twice over, and less than the first chunk's 160 ms, so that a stream
generated several times faster than real time (a GPU) keeps the schedule's chunks; 240 was
worse there (more, smaller chunks)."""


@dataclass
class DecoderConfig:
    """Settings of the decoder stage."""

    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    """Torch device (the model stage's ``--device``)."""
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)
    """Torch dtype name (the model stage's ``--dtype``)."""
    max_streams: int = 64
    """Concurrent Decode streams; more -> RESOURCE_EXHAUSTED."""
    max_prefix_frames: int = field(default=2000, metadata=NOT_A_FLAG)
    """Longest voice-clone prefix accepted."""
    cuda_graphs: str = field(default="auto", metadata=flag(choices=CUDA_GRAPHS_CHOICES))
    """Replay one captured CUDA graph per (batch, frames) bucket (CUDA only): auto = capture and
    self-check before serving, falling back to eager on a failure (ERROR log, metric, reason in
    the model info); on = a failure stops the decoder; off = eager."""
    graph_memory: int = field(default=DEFAULT_GRAPH_MEMORY, metadata=flag(parse=parse_size))
    """Bound on the device memory the CUDA graphs hold (pool and static inputs), e.g. 4GiB;
    0 = no bound. Batch sizes are captured smallest first (every frames bucket of each) while
    they fit; a larger group of streams then runs as several captured steps (same audio). All 42
    default buckets measured 7.7 GiB (bfloat16) / 9.5 GiB (float32) on an H200, mostly the
    largest batches' activations; 4 GiB keeps batch sizes up to about 8 (float32) or 16
    (bfloat16), where those steps are already compute-bound. The talker's
    --other-stages-memory must count this bound (deploy/OPERATIONS.md)."""
    playout_headroom_ms: float = field(
        default=DEFAULT_PLAYOUT_HEADROOM_MS, metadata=flag(parse=non_negative_float)
    )
    """Send the frames a stream holds, before its chunk is full, once a listener who started
    playing at its first chunk would have less than this much audio left when they are decoded
    (:mod:`decoder_service.pacing`:
    a stream slower than twice real time otherwise runs dry each time the chunk size doubles);
    0 (the default) = chunk sizes from the schedule only, the same audio bits on every run
    (paced, the chunk boundaries and so the last bits depend on timing); 120 on CPU hosts serving
    live listeners (deploy/OPERATIONS.md)."""
    emulate_cuda_graphs: bool = field(default=False, metadata=NOT_A_FLAG)
    """Run the graph path without CUDA (eager replays on the static buffers; tests)."""


FLAGS = stage_flags(
    STAGE,
    DEFAULT_PORT,
    "qwen3-tts decoder stage (codec frames -> 24 kHz audio, seamless streaming)",
    ("decoder", DecoderConfig),
)


def decoder_config_from_args(model: StageModelConfig, args: argparse.Namespace) -> DecoderConfig:
    """The :class:`DecoderConfig` of a namespace parsed by ``FLAGS`` (device and dtype from the
    model flags)."""
    return config_from_args(DecoderConfig, args, device=model.device, dtype=model.dtype)


__all__ = [
    "DEFAULT_GRAPH_MEMORY",
    "DEFAULT_PLAYOUT_HEADROOM_MS",
    "DEFAULT_PORT",
    "FLAGS",
    "STAGE",
    "DecoderConfig",
    "decoder_config_from_args",
]
