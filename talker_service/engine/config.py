"""Typed configuration of the talker engine (also the talker process's engine flags, see
:mod:`talker_service.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts_common.flags import NOT_A_FLAG, flag, positive_int
from tts_common.memory import MemoryBudget, parse_memory_budget, parse_size
from tts_common.precision import LINEAR_CHOICES, QUANTIZATION_CHOICES
from tts_common.self_check import CUDA_GRAPHS_CHOICES
from tts_common.synthesis import DEFAULT_SLOT_POSITIONS, RUNAWAY_GUARD, RunawayGuard


@dataclass
class EngineConfig:
    """How many requests the talker engine runs at once and how it schedules them."""

    max_slots: int = 16
    """Most requests decoded concurrently (one KV slot each; fewer when --kv-memory holds fewer)."""
    max_seq_len: int = DEFAULT_SLOT_POSITIONS
    """Talker KV positions per slot: prompt length plus frame budget must fit."""
    max_waiting: int = 64
    """Requests allowed to wait for a slot; more are refused (RESOURCE_EXHAUSTED)."""
    batch_buckets: tuple[int, ...] | None = field(default=None, metadata=NOT_A_FLAG)
    """Batch sizes a decode step is padded to on CUDA (one captured graph each, all captured at
    startup; ``max_slots`` is always one, larger ones are dropped: see :attr:`graph_buckets`).
    None: every power of two below ``max_slots``."""
    max_prefill_tokens_per_step: int = field(default=256, metadata=NOT_A_FLAG)
    """Prompt positions prefilled between two decode steps (at least one whole request), so that
    newcomers never stall running streams for much more than one step."""
    max_prefills_per_step: int = field(default=4, metadata=flag(parse=positive_int))
    """Requests admitted between two decode steps while other requests are running (prefilled
    together, in as few forwards as their lengths allow: runner.forward_groups). Their prefill
    delays every running stream's next frame: on CPU it grows with the prompt positions (0.6B,
    2 cores: 4 prompts of 12 positions together 0.3 s, beside a 0.6 s batch-8 step). 4: 16
    newcomers get their first frame 2-3x sooner than at 1 per step, for a p99 frame gap of the
    running streams 15-30% longer (bench/results/admission_stall.json). An idle engine admits
    up to the token bound at once."""
    cuda_graphs: str = field(default="auto", metadata=flag(choices=CUDA_GRAPHS_CHOICES))
    """Capture the whole decode step as one CUDA graph per batch bucket (CUDA only): auto = capture
    and self-check before serving, falling back to eager on a failure (ERROR log, metric, reason
    in the model info); on = a failure stops the talker; off = eager."""
    emulate_cuda_graphs: bool = field(default=False, metadata=NOT_A_FLAG)
    """Run the graph path without CUDA (any device): "capture" records each bucket's static step,
    "replay" reruns it eagerly on the same buffers. For tests of the graph bookkeeping on CPU."""
    in_place_attention: str = field(default="auto", metadata=NOT_A_FLAG)
    """Graph-path attention kernel: "flex" (FlexAttention), "sdpa" (masked SDPA) or "auto"
    (flex on CUDA, sdpa elsewhere); see talker_service.model.decode_attention."""
    noise_steps_per_draw: int = field(default=8, metadata=NOT_A_FLAG)
    """Decode steps of Gumbel noise a sampling request draws at once (per-slot noise table of
    this many steps, ~1 MiB per slot at 8 for the released vocabularies)."""
    runaway_guard: RunawayGuard = field(default=RUNAWAY_GUARD, metadata=NOT_A_FLAG)
    """Frame budget of requests that leave max_new_tokens unset (capped to what fits a slot)."""
    kv_memory: MemoryBudget = field(
        default=MemoryBudget(fraction=0.5), metadata=flag(parse=parse_memory_budget)
    )
    """Memory the talker KV cache may take with every slot full: a fraction of the memory
    available after loading the weights (RAM on CPU, free GPU memory on CUDA), or a size such as
    4GiB; the slot count is what fits, at most --max-slots (see engine/kv_memory.py)."""
    other_stages_memory: int = field(default=0, metadata=flag(parse=parse_size))
    """Device memory the stages beside the talker on its device take (decoder, speaker: weights,
    graphs, CUDA contexts; ``qwen3-tts doctor`` prints it in the device's memory plan), e.g. 3GiB.
    On CUDA a --kv-memory fraction is then of the device's total less this share and what the
    talker holds after loading, whichever stage loads first; elsewhere of the available memory
    less this share."""
    linear: str = field(default="auto", metadata=flag(choices=LINEAR_CHOICES))
    """CPU linear kernels: auto = the fastest per layer shape, measured at load over the batch
    buckets and cached per CPU model; onednn (pre-packed), gemv (ours), torch (tts_common/precision.py)."""
    quantization: str = field(default="none", metadata=flag(choices=QUANTIZATION_CHOICES))
    """CPU only: int8 = weight-only int8 (per-output-channel scales) for the talker and the code
    predictor; w8a8 = those weights and int8 activations (per token), faster in batches, lossier;
    codes differ from float32 (tts_common/precision.py)."""
    device: str = field(default="cpu", metadata=NOT_A_FLAG)
    dtype: str = field(default="float32", metadata=NOT_A_FLAG)

    def frames_that_fit(self, prompt_len: int) -> int:
        """Frames a slot holds after a prompt of ``prompt_len`` positions (one kept spare)."""
        return self.max_seq_len - prompt_len - 1

    @property
    def graph_buckets(self) -> tuple[int, ...]:
        """The batch buckets captured as graphs: the configured ones (by default the powers of
        two) below ``max_slots``, and ``max_slots`` (a bucket-B step runs over slots 0..B-1, so
        none may exceed the slots)."""
        configured = self.batch_buckets
        if configured is None:
            configured = tuple(2**i for i in range(self.max_slots.bit_length()))
        return tuple(sorted({b for b in configured if 0 < b < self.max_slots} | {self.max_slots}))

    def bucket_for(self, batch: int) -> int:
        """Smallest graph bucket that holds ``batch`` rows (``batch`` <= ``max_slots``)."""
        for bucket in self.graph_buckets:
            if bucket >= batch:
                return bucket
        raise ValueError(f"{batch} rows exceed the {self.max_slots} slots")
