"""Talker stage against the official implementation's greedy outputs (tests/fixtures/reference).

For every request of every fixture set: text ids, prefill embeddings / trailing rows, and the
greedy codes (max_new_tokens 80, repetition_penalty 1.05) alone and as one batch, with the
default CPU linears (measured: our float32 GEMV and fused stacks, or pre-packed oneDNN), with
our GEMV forced and with torch's own; plus sampled determinism (same seed -> same codes alone and
batched) and bit-exact batch invariance of the decode step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from talker_service.engine import FinishReason
from talker_service.model import PromptInputs, TalkerModel
from talker_service.model.sampling import SamplingTensors
from talker_service.model.step import DecodeState, decode_step, prefill
from tests.helpers.fixtures import fixture_prompt_inputs
from tests.helpers.talker import generate
from tts_common.kernels.candidates import KernelLinear
from tts_common.kernels.choice import set_up_linears
from tts_common.kernels.gemv import gemv_available, w8a8_kernel_available
from tts_common.onednn_linear import OneDnnLinear, onednn_linear_available
from tts_common.synthesis import SamplingParams

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NAMES = ["tiny_custom_voice", "tiny_custom_voice_1b7", "tiny_voice_design", "tiny_base"]
MAX_NEW_TOKENS = 80


@dataclass
class Case:
    name: str
    rid: str
    folder: Path
    index: str
    raw: dict

    def npy(self, stem: str) -> np.ndarray:
        return np.load(self.folder / f"{stem}_{self.index}.npy")

    def has(self, stem: str) -> bool:
        return (self.folder / f"{stem}_{self.index}.npy").exists()

    def request(self) -> PromptInputs:
        """Prompt inputs; voice-clone inputs are the official speaker-stage outputs of the case."""
        return fixture_prompt_inputs(self.name, self.raw)


def _cases(name: str) -> list[Case]:
    out = []
    ref = FIXTURES / "reference" / name
    for line in (ref / "requests.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        rel = Path(raw["expect"]["codes"])
        index = rel.stem.split("_")[-1]
        out.append(Case(name, raw["id"], ref / rel.parent, index, raw))
    return out


ALL_CASES = [c for n in NAMES for c in _cases(n)]
CASE_IDS = [f"{c.name}:{c.rid}" for c in ALL_CASES]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


_MODELS: dict[str, TalkerModel] = {}


def model_for(name: str) -> TalkerModel:
    if name not in _MODELS:
        _MODELS[name] = TalkerModel.from_checkpoint(FIXTURES / "ckpt" / name)
    return _MODELS[name]


_SINGLE: dict[str, np.ndarray] = {}


def greedy_codes(case: Case) -> np.ndarray:
    key = f"{case.name}:{case.rid}"
    if key not in _SINGLE:
        m = model_for(case.name)
        _SINGLE[key] = generate(m, [case.request()], MAX_NEW_TOKENS, SamplingParams.greedy(1.05))[0].codes
    return _SINGLE[key]


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_text_ids(case: Case) -> None:
    tok = model_for(case.name).tokenizer
    r = case.raw
    assert tok.synthesis_ids(r["text"]) == case.npy("input_ids")[0].tolist()
    if case.has("instruct_ids"):
        assert tok.instruct_ids(r["instruct"]) == case.npy("instruct_ids")[0].tolist()
    if case.has("ref_ids"):
        assert tok.ref_ids(r["ref_text"]) == case.npy("ref_ids")[0].tolist()


def _assert_close_rel(got: torch.Tensor, want: np.ndarray, rel: float = 1e-5) -> None:
    got_np = got.detach().to(torch.float32).cpu().numpy()
    assert got_np.shape == want.shape
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got_np, want, rtol=rel, atol=rel * scale)


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_prompt_embeddings(case: Case) -> None:
    prompt = model_for(case.name).build_prompt(case.request())
    _assert_close_rel(prompt.prefill, case.npy("prefill_embeds"))
    _assert_close_rel(prompt.trailing, case.npy("trailing"))
    summary = json.loads((case.folder / "case.json").read_text())
    utt = summary["utterances"][int(case.index)]
    assert prompt.prefill_len == utt["prefill_len"]
    assert prompt.trailing.shape[0] == utt["trailing_len"]


@pytest.mark.parametrize("case", ALL_CASES, ids=CASE_IDS)
def test_greedy_codes_alone(case: Case) -> None:
    want = case.npy("codes")
    got = greedy_codes(case)
    assert got.dtype == np.int64
    assert got.shape == want.shape, f"{got.shape} != {want.shape}"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_codes_alone_with_torch_linears(name: str) -> None:
    """The fallback kernels (CUDA, bf16, torch without oneDNN) reproduce the reference too."""
    m = TalkerModel.from_checkpoint(FIXTURES / "ckpt" / name)
    for case in _cases(name)[:2]:
        got = generate(m, [case.request()], MAX_NEW_TOKENS, SamplingParams.greedy(1.05), linear="torch")
        np.testing.assert_array_equal(got[0].codes, case.npy("codes"), err_msg=case.rid)
    assert not any(isinstance(mod, OneDnnLinear) for mod in m.talker.modules())


@pytest.mark.skipif(not gemv_available(), reason="no C compiler, or neither AVX-512 nor AVX2 with FMA")
@pytest.mark.parametrize("name", NAMES)
def test_greedy_codes_alone_with_our_float32_gemv_and_fused_stacks(name: str) -> None:
    """Our float32 GEMV on every linear (``--linear gemv``), the talker and the code predictor
    each one fused stack call: the official codes still, alone and batched."""
    m = TalkerModel.from_checkpoint(FIXTURES / "ckpt" / name)
    cases = _cases(name)[:2]
    params = SamplingParams.greedy(1.05)
    alone = [generate(m, [c.request()], MAX_NEW_TOKENS, params, linear="gemv")[0] for c in cases]
    assert m.talker.model.fused_stack is not None and m.talker.code_predictor.model.fused_stack is not None
    batched = generate(m, [c.request() for c in cases], MAX_NEW_TOKENS, params, linear="gemv")
    for case, one, many in zip(cases, alone, batched):
        np.testing.assert_array_equal(one.codes, case.npy("codes"), err_msg=case.rid)
        np.testing.assert_array_equal(many.codes, case.npy("codes"), err_msg=case.rid)


@pytest.mark.skipif(not onednn_linear_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize(
    ("dtype", "quantization", "linear"),
    [
        ("float32", "none", "auto"),
        ("bfloat16", "none", "auto"),
        ("float32", "int8", "auto"),
        ("float32", "w8a8", "auto"),
        pytest.param(
            "float32",
            "w8a8",
            "gemv",
            marks=pytest.mark.skipif(not w8a8_kernel_available(), reason="no w8a8 GEMV here"),
        ),
        *(
            pytest.param(
                dtype,
                quantization,
                "gemv",
                marks=pytest.mark.skipif(
                    not gemv_available(), reason="no C compiler or AVX-512: no GEMV, no fused stack"
                ),
            )
            for dtype, quantization in (("float32", "none"), ("float32", "int8"), ("bfloat16", "none"))
        ),
    ],
)
def test_decode_step_is_batch_invariant_to_the_bit(dtype: str, quantization: str, linear: str) -> None:
    """Rows at the same position get the same bits alone and batched, with the kernels an engine
    chooses on CPU (``--linear auto``) for each dtype and quantization, and with our int8 or bf16
    GEMV everywhere (``--linear gemv``: float32, int8 or bf16 weights; int8 weights and
    activations, w8a8), where the talker and the
    code predictor each run as one fused stack call (tts_common.kernels.fused_stack).

    The linears and the code predictor are batch-invariant (tts_common.kernels). A row shorter
    than the batch's longest reads its keys through a longer masked window, which sums in another
    order (last-bit differences): the code tests above check its tokens instead.
    """
    m = TalkerModel.from_checkpoint(FIXTURES / "ckpt" / "tiny_voice_design", dtype=getattr(torch, dtype))
    set_up_linears(m.talker, m.device, m.dtype, linear, quantization, (1, 2))
    assert all(type(mod) is not torch.nn.Linear for mod in m.talker.modules())
    assert any(isinstance(mod, KernelLinear) for mod in m.talker.modules())
    if linear == "gemv":
        assert (
            m.talker.model.fused_stack is not None and m.talker.code_predictor.model.fused_stack is not None
        )
    cases = _cases("tiny_voice_design")
    prompts = [m.build_prompt(cases[i].request()) for i in (0, 2)]
    assert prompts[0].prefill_len == prompts[1].prefill_len
    assert not torch.equal(prompts[0].prefill, prompts[1].prefill)
    params = SamplingTensors.stack([SamplingParams.greedy()], torch.device("cpu"))

    def past_hidden_per_step(rows: list[int], steps: int = 4) -> torch.Tensor:
        cache = m.allocate_cache(len(rows), 256)
        state = DecodeState.cat(
            [prefill(m.talker, cache, slot, prompts[i].prefill, params) for slot, i in enumerate(rows)]
        )
        state.slots = None  # row b is slot b
        out = []
        for step in range(steps):
            trailing = torch.stack([prompts[i].trailing_row(step) for i in rows])
            decode_step(m.talker, cache, state, trailing, int(state.positions.max()) + 1)
            out.append(state.past_hidden.clone())
        return torch.stack(out, dim=1)

    together = past_hidden_per_step([0, 1])
    for row in range(2):
        assert torch.equal(past_hidden_per_step([row])[0], together[row]), row


@pytest.mark.parametrize("name", NAMES)
def test_greedy_codes_batched(name: str) -> None:
    """All requests of a set at once: each gets its official codes, ended as the official one."""
    cases = _cases(name)
    out = generate(model_for(name), [c.request() for c in cases], MAX_NEW_TOKENS, SamplingParams.greedy(1.05))
    for c, got in zip(cases, out):
        np.testing.assert_array_equal(got.codes, c.npy("codes"), err_msg=c.rid)
        summary = json.loads((c.folder / "case.json").read_text())
        stopped_by_eos = summary["utterances"][int(c.index)]["stopped_by_eos"]
        assert got.finish_reason is (FinishReason.EOS if stopped_by_eos else FinishReason.LENGTH), c.rid


def test_max_new_tokens_gives_at_most_m_minus_1_frames() -> None:
    case = _cases("tiny_custom_voice")[1]
    m = model_for(case.name)
    want = case.npy("codes")
    for budget in (2, 5):
        got = generate(m, [case.request()], budget, SamplingParams.greedy())[0]
        assert got.codes.shape == (budget - 1, 16) and got.finish_reason is FinishReason.LENGTH
        np.testing.assert_array_equal(got.codes, want[: budget - 1])


def test_sampling_same_seed_alone_and_batched() -> None:
    m = model_for("tiny_custom_voice_1b7")
    cases = _cases("tiny_custom_voice_1b7")
    reqs = [cases[1].request(), cases[5].request(), cases[6].request()]
    sampled = SamplingParams(do_sample=True, subtalker_do_sample=True, temperature=0.9, top_k=50, seed=1234)
    other = SamplingParams(do_sample=True, subtalker_do_sample=True, top_p=0.8, seed=7)
    budget = 24
    alone = generate(m, [reqs[0]], budget, sampled)[0].codes
    again = generate(m, [reqs[0]], budget, sampled)[0].codes
    np.testing.assert_array_equal(alone, again)
    batched = [
        g.codes
        for g in generate(m, [reqs[1], reqs[0], reqs[2]], budget, [SamplingParams.greedy(), sampled, other])
    ]
    np.testing.assert_array_equal(batched[1], alone)
    np.testing.assert_array_equal(batched[0], greedy_codes(cases[5])[: budget - 1])
    other_alone = generate(m, [reqs[2]], budget, other)[0].codes
    np.testing.assert_array_equal(batched[2], other_alone)
    reseeded = generate(
        m, [reqs[0]], budget, SamplingParams(do_sample=True, subtalker_do_sample=True, seed=99)
    )[0]
    assert not np.array_equal(reseeded.codes, alone)
    assert int(alone.max()) < 2048 and int(alone.min()) >= 0
