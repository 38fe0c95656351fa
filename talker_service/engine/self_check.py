"""The talker's graph-path self-checks: what must hold before a captured decode step serves.

Three checks (``tts_common.self_check`` runs them and applies ``--cuda-graphs``):

* ``talker.block_lists``: for every bucket and key lengths around the block edges, the key-block
  lists of the FlexAttention :class:`~torch.nn.attention.flex_attention.BlockMask` (whole blocks
  and the partial block per row) equal what the lengths imply, computed here independently. On CPU
  eager FlexAttention applies only ``mask_mod`` and ignores the lists, so a wrong list (say
  ``_partial_idx``) would pass every CPU comparison of outputs and be silently wrong on a GPU; this
  check reads the lists themselves. (The ``sdpa`` kernel's boolean mask is checked the same way.)
* ``talker.attention``: the graph path's attention (the kernel it serves with) against a dense
  fp32 softmax reference at the checkpoint's head dims, per bucket, same lengths.
* ``talker.graph_vs_eager``: the captured steps against the eager path over the same requests:
  greedy rows' codes identical, and sampled rows' codes identical given the same noise (each row's
  seeded stream), for the buckets checked, the greedy-only variant too (see
  :func:`verify_graph_vs_eager` for the reference on CPU and on CUDA).

``short=True`` (startup) checks the smallest and largest bucket; ``qwen3-tts doctor`` checks all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tts_common.self_check import CheckFailedError, GraphPathOutcome, SelfCheckReport, choose_graph_path
from tts_common.synthesis import SamplingParams

from ..model.decode_attention import KV_BLOCK, InPlaceAttention
from ..model.prompt import TalkerPrompt
from ..model.talker import KVCache, Talker
from .config import EngineConfig
from .cuda_graphs import GraphStep, graph_mode
from .request import EngineRequest

Check = tuple[str, Callable[[], dict[str, Any] | None]]


def edge_lengths(max_len: int) -> list[int]:
    """Key lengths around the block edges that a slot of ``max_len`` positions can hold."""
    wanted = [1, KV_BLOCK - 1, KV_BLOCK, KV_BLOCK + 1, 2 * KV_BLOCK, max_len - 1, max_len]
    return sorted({n for n in wanted if 1 <= n <= max_len})


def row_lengths(batch: int, lengths: Sequence[int]) -> list[list[int]]:
    """Per-row length vectors covering every length in ``lengths`` on every row position of a
    ``batch``-row step (rotations), at least one vector."""
    n = len(lengths)
    rounds = n if batch < n else 1
    return [[lengths[(b + r) % n] for b in range(batch)] for r in range(rounds)]


def expected_blocks(length: int, blocks: int) -> tuple[set[int], set[int]]:
    """(whole blocks, partial blocks) a row of ``length`` keys must list, from the length alone."""
    full = {j for j in range(blocks) if (j + 1) * KV_BLOCK <= length}
    partial = {j for j in range(blocks) if j * KV_BLOCK < length < (j + 1) * KV_BLOCK}
    return full, partial


def _listed(num: torch.Tensor, idx: torch.Tensor, row: int) -> list[int]:
    count = int(num[row, 0, 0])
    return [int(i) for i in idx[row, 0, 0, :count]]


def verify_block_lists(attention: InPlaceAttention, lengths: Sequence[int]) -> None:
    """Set ``lengths`` and compare the mask the kernel reads with what they imply (CheckFailedError)."""
    attention.set_lengths(torch.tensor(lengths, dtype=torch.int64, device=attention.lengths.device))
    where = f"B={attention.batch}, max_len={attention.max_len}"
    if attention.kernel == "sdpa":
        keys = torch.arange(attention.max_len)
        got = attention.mask[:, 0, 0].cpu()
        for row, length in enumerate(lengths):
            if not torch.equal(got[row], keys < length):
                raise CheckFailedError(f"sdpa mask of row {row} (length {length}, {where}) is wrong")
        return
    mask = attention.block_mask
    blocks = -(-attention.max_len // KV_BLOCK)
    for row, length in enumerate(lengths):
        full, partial = expected_blocks(length, blocks)
        got_full = _listed(mask.full_kv_num_blocks.cpu(), mask.full_kv_indices.cpu(), row)  # type: ignore[union-attr]
        got_partial = _listed(mask.kv_num_blocks.cpu(), mask.kv_indices.cpu(), row)
        if sorted(got_full) != sorted(full) or len(set(got_full)) != len(got_full):
            raise CheckFailedError(
                f"whole-block list of row {row} (length {length}, {where}) is {got_full}, "
                f"expected {sorted(full)}"
            )
        if sorted(got_partial) != sorted(partial) or len(set(got_partial)) != len(got_partial):
            raise CheckFailedError(
                f"partial-block list of row {row} (length {length}, {where}) is {got_partial}, "
                f"expected {sorted(partial)}"
            )
        if int(attention.lengths[row]) != length:
            raise CheckFailedError(f"mask_mod length of row {row} ({where}) is not {length}")


def verify_attention(
    attention: InPlaceAttention, cache: KVCache, heads: int, lengths: Sequence[int], seed: int = 0
) -> float:
    """Attention over cache slots 0..B-1 (layer 0, filled with random keys and values) against a
    dense fp32 softmax per row; returns the largest difference (CheckFailedError beyond tolerance)."""
    b, max_len = attention.batch, attention.max_len
    keys, values = cache.k[0, :b], cache.v[0, :b]
    kv_heads, head_dim = keys.shape[1], keys.shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    keys.copy_(torch.randn(keys.shape, generator=gen).to(keys.dtype))
    values.copy_(torch.randn(values.shape, generator=gen).to(values.dtype))
    q = torch.randn(b, heads, 1, head_dim, generator=gen).to(keys.device, keys.dtype)
    attention.set_lengths(torch.tensor(lengths, dtype=torch.int64, device=keys.device))
    scale = head_dim**-0.5
    got = attention.attend(q, keys, values, scale, enable_gqa=heads != kv_heads).float()
    group = heads // kv_heads
    worst = 0.0
    for row, length in enumerate(lengths):
        k = keys[row, :, :length].float().repeat_interleave(group, dim=0)  # [heads, L, hd]
        v = values[row, :, :length].float().repeat_interleave(group, dim=0)
        probs = (q[row].float() @ k.transpose(-1, -2) * scale).softmax(dim=-1)  # [heads, 1, L]
        want = probs @ v
        worst = max(worst, float((got[row] - want).abs().max()))
    tolerance = 1e-4 if keys.dtype == torch.float32 else 3e-2
    if not worst <= tolerance:  # NaN fails too
        raise CheckFailedError(
            f"{attention.kernel} attention differs from the dense reference by {worst:.3g} "
            f"(> {tolerance}) at B={b}, max_len={max_len}, lengths {sorted(set(lengths))}"
        )
    return worst


def check_prompt(talker: Talker, seed: int, prompt_len: int = 9) -> TalkerPrompt:
    """A synthetic prompt: codec embeddings of seeded random ids (the model's own scale)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vocab = talker.cfg.vocab_size - 1024
    device = next(talker.parameters()).device
    ids = torch.randint(0, max(vocab, 2), (prompt_len + 3,), generator=gen).to(device)
    with torch.inference_mode():
        rows = talker.codec_embed(ids)
    return TalkerPrompt(
        prefill=rows[:prompt_len], trailing=rows[prompt_len:-1], tts_pad=rows[-1], text_tokens=2
    )


def row_sampling(row: int, greedy_only: bool = False) -> SamplingParams:
    """Greedy, both stages sampled, talker-only and code-predictor-only rows in turn (all greedy
    with ``greedy_only``: the greedy variant of the graphs)."""
    kind = 0 if greedy_only else row % 4
    if kind == 0:
        return SamplingParams.greedy()
    if kind == 1:
        return SamplingParams(seed=1000 + row, temperature=0.9, top_k=50, top_p=0.95)
    if kind == 2:
        return SamplingParams(seed=1000 + row, subtalker_do_sample=False)
    return SamplingParams(seed=1000 + row, do_sample=False, subtalker_do_sample=True)


def prefill_rows(
    runner: Any, talker: Talker, batch: int, max_frames: int, greedy_only: bool = False
) -> list[EngineRequest]:
    """Prefill ``batch`` check requests (synthetic prompts, :func:`row_sampling`) into slots
    0..B-1 of ``runner``."""
    requests = []
    for row in range(batch):
        request = EngineRequest(
            f"self-check-{row}", None, row_sampling(row, greedy_only), None, lambda e: None
        )  # type: ignore[arg-type]
        request.prompt = check_prompt(talker, seed=row)
        request.slot = row
        request.max_frames = max_frames
        requests.append(request)
    runner.prefill(requests)
    return requests


def step_rows(runner: Any, requests: list[EngineRequest]) -> list[list[int]]:
    """One decode step of ``requests``: each row's frame."""
    out = runner.step(requests)
    for request in requests:
        request.frames_emitted += 1
    return out.frame_codes.tolist()


def run_rows(
    runner: Any, talker: Talker, batch: int, steps: int, greedy_only: bool = False
) -> list[list[list[int]]]:
    """Prefill ``batch`` check requests into slots 0..B-1 of ``runner`` and decode ``steps``
    steps; each row's frames."""
    requests = prefill_rows(runner, talker, batch, steps, greedy_only)
    frames: list[list[list[int]]] = [[] for _ in requests]
    for _ in range(steps):
        for row, codes in enumerate(step_rows(runner, requests)):
            frames[row].append(codes)
    return frames


def verify_graph_vs_eager(
    runner: Any, graphs: GraphStep, talker: Talker, batch: int, steps: int, greedy_only: bool = False
) -> None:
    """Graph-path frames of ``batch`` rows (bucket ``bucket_for(batch)``) against the eager
    path (CheckFailedError naming the first differing row and step).

    The eager reference: emulated graphs (CPU) are compared with a fresh eager runner of just
    those rows (the whole graph bookkeeping against the reference numerics, bit for bit). Real
    CUDA graphs are compared with the same steps run eagerly on the same buffers (no capture):
    the same kernels, so the same bits, where the eager runner's other attention kernel would flip
    bf16 near-ties; FlexAttention itself is checked by ``talker.attention`` and
    ``talker.block_lists``."""
    from .runner import TalkerRunner

    config = graphs.config
    saved, runner.graphs = runner.graphs, graphs
    try:
        if graphs.report.mode == "cuda":
            graphs.replay = False
            try:
                want = run_rows(runner, talker, batch, steps, greedy_only)
            finally:
                graphs.replay = True
        else:
            eager_config = dataclasses.replace(
                config,
                max_slots=batch,
                max_seq_len=check_prompt(talker, 0).prefill_len + steps + 2,
                emulate_cuda_graphs=False,
                cuda_graphs="off",
            )
            want = run_rows(TalkerRunner(talker, eager_config), talker, batch, steps, greedy_only)
        got = run_rows(runner, talker, batch, steps, greedy_only)
    finally:
        runner.graphs = saved
    for row in range(batch):
        if got[row] != want[row]:
            step = next(i for i, (a, b) in enumerate(zip(got[row], want[row])) if a != b)
            kind = "greedy" if greedy_only or row % 4 == 0 else "sampled"
            variant = "greedy-only" if greedy_only else "sampling"
            raise CheckFailedError(
                f"{variant} graph step of bucket {config.bucket_for(batch)} gave other codes than eager for "
                f"{kind} row {row} at step {step}: {got[row][step]} vs {want[row][step]}"
            )


def graph_checks(
    runner: Any, graphs: GraphStep, talker: Talker, *, short: bool, steps: int | None = None
) -> list[Check]:
    """The talker's checks of ``graphs`` (built for ``runner``; see the module docstring)."""
    buckets = sorted(graphs.buckets)
    checked = sorted({buckets[0], buckets[-1]}) if short else buckets
    lengths = edge_lengths(graphs.buckets[buckets[0]].attention.max_len)
    heads = talker.cfg.num_attention_heads
    steps = steps if steps is not None else (2 if short else 4)

    def block_lists() -> dict[str, Any]:
        rows = 0
        for bucket in checked:
            attention = graphs.buckets[bucket].attention
            probes = [attention]
            if attention.kernel != "flex":  # the CUDA kernel's lists are checked on every host
                probes.append(InPlaceAttention(bucket, attention.max_len, attention.lengths.device, "flex"))
            for probe in probes:
                for vector in row_lengths(bucket, lengths):
                    verify_block_lists(probe, vector)
                    rows += len(vector)
        return {"buckets": checked, "lengths": lengths, "rows_checked": rows}

    def attention() -> dict[str, Any]:
        worst = 0.0
        for bucket in checked:
            for vector in row_lengths(bucket, lengths):
                worst = max(
                    worst, verify_attention(graphs.buckets[bucket].attention, runner.cache, heads, vector)
                )
        return {"buckets": checked, "max_abs_diff": worst, "kernel": graphs.kernel}

    def graph_vs_eager() -> dict[str, Any]:
        for bucket in checked:
            verify_graph_vs_eager(runner, graphs, talker, bucket, steps)
            verify_graph_vs_eager(runner, graphs, talker, bucket, steps, greedy_only=True)
        return {"buckets": checked, "steps": steps, "variants": ["sampling", "greedy-only"]}

    return [
        ("talker.block_lists", block_lists),
        ("talker.attention", attention),
        ("talker.graph_vs_eager", graph_vs_eager),
    ]


def start_graph_path(runner: Any, config: EngineConfig) -> GraphPathOutcome:
    """The engine's start: build ``runner``'s graph path, self-check it (short form) and install
    it on the runner if it passes; ``--cuda-graphs`` decides what a failure does
    (:func:`tts_common.self_check.choose_graph_path`). No graph path applies: eager, no checks."""
    from tts_common import metrics

    if graph_mode(config, runner.device) is None:
        metrics.GRAPH_PATH.labels(stage="talker").set(0)
        return GraphPathOutcome(None, SelfCheckReport("talker"))
    outcome = choose_graph_path(
        "talker",
        "on" if config.cuda_graphs == "on" else "auto",
        runner.build_graphs,
        lambda graphs: graph_checks(runner, graphs, runner.talker, short=True),
    )
    runner.graphs = outcome.graphs
    metrics.GRAPH_PATH.labels(stage="talker").set(int(outcome.graphs is not None))
    return outcome


__all__ = [
    "start_graph_path",
    "edge_lengths",
    "expected_blocks",
    "graph_checks",
    "prefill_rows",
    "row_lengths",
    "run_rows",
    "step_rows",
    "verify_attention",
    "verify_block_lists",
    "verify_graph_vs_eager",
]
