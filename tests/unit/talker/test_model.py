"""Talker stage units: real-size shapes on the meta device, request validation, sampling
processors (against the transformers processors the official code uses), the decode step's slot
modes and its capturability (no graph breaks / host syncs)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from talker_service.engine import EngineConfig
from talker_service.model import (
    DecodeState,
    PromptInputs,
    SamplingTensors,
    Talker,
    TalkerModel,
    decode_step,
    prefill,
)
from talker_service.model.sampling import (
    apply_talker_penalties,
    choose_tokens,
    gumbel_from_uniform_,
    suppress_mask,
    warp_for_sampling,
)
from talker_service.model_info import engine_inputs, talker_info
from tests.helpers.talker import generate
from tts_common.codes import codes_to_proto
from tts_common.config import CodePredictorConfig, TalkerConfig
from tts_common.errors import FailedPreconditionError, InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis import SamplingParams

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CKPT = FIXTURES / "ckpt"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- real-size shapes (ARCHITECTURE.md §2-3) ------------------------------------------------------


def _real_config(size: str) -> TalkerConfig:
    hidden, inter = (1024, 3072) if size == "0b6" else (2048, 6144)
    return TalkerConfig(
        text_vocab_size=151936,
        vocab_size=3072,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1_000_000,
        rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        num_code_groups=16,
        text_hidden_size=2048,
        code_predictor=CodePredictorConfig(
            vocab_size=2048,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=5,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1_000_000,
            max_position_embeddings=65536,
            num_code_groups=16,
        ),
    )


EXPECTED = {
    "0b6": {
        "layers": 440_466_432,
        "text_emb": 311_164_928,
        "codec_emb": 3_145_728,
        "proj": 6_294_528,
        "head": 3_145_728,
        "cp": 141_570_304,
        "cp_layers": 78_654_720,
        "cp_emb": 31_457_280,
        "cp_heads": 31_457_280,
        "mtp": 0,
        "total": 905_788_672,
    },
    "1b7": {
        "layers": 1_409_408_000,
        "text_emb": 311_164_928,
        "codec_emb": 6_291_456,
        "proj": 8_392_704,
        "head": 6_291_456,
        "cp": 175_125_760,
        "cp_layers": 78_654_720,
        "cp_emb": 62_914_560,
        "cp_heads": 31_457_280,
        "mtp": 2_098_176,
        "total": 1_916_676_352,
    },
}


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _pattern(key: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", key)


def _fixture_patterns() -> set[str]:
    with safe_open(str(CKPT / "tiny_custom_voice" / "model.safetensors"), "pt") as fh:
        return {_pattern(k[len("talker.") :]) for k in fh.keys() if k.startswith("talker.")}


@pytest.mark.parametrize("size", ["0b6", "1b7"])
def test_real_size_parameter_counts_and_keys(size: str) -> None:
    with torch.device("meta"):
        talker = Talker(_real_config(size))
    e = EXPECTED[size]
    assert _count(talker.model.layers) == e["layers"]
    assert talker.model.text_embedding.weight.numel() == e["text_emb"]
    assert talker.model.codec_embedding.weight.numel() == e["codec_emb"]
    assert _count(talker.text_projection) == e["proj"]
    assert _count(talker.codec_head) == e["head"]
    cp = talker.code_predictor
    assert _count(cp) == e["cp"]
    assert _count(cp.model.layers) == e["cp_layers"]
    assert _count(cp.model.codec_embedding) == e["cp_emb"]
    assert _count(cp.lm_head) == e["cp_heads"]
    assert _count(cp.small_to_mtp_projection) == e["mtp"]
    assert isinstance(cp.small_to_mtp_projection, torch.nn.Identity) == (size == "0b6")
    assert _count(talker) == e["total"]  # CustomVoice / VoiceDesign model.safetensors total
    keys = {_pattern(k) for k in talker.state_dict()}
    want = _fixture_patterns()
    if size == "0b6":  # Identity projection: no weights in the released 0.6B files
        want = {k for k in want if not k.startswith("code_predictor.small_to_mtp_projection")}
    assert keys == want


@pytest.mark.parametrize(
    "name", ["tiny_custom_voice", "tiny_custom_voice_1b7", "tiny_voice_design", "tiny_base"]
)
def test_fixture_checkpoints_load_strictly(name: str) -> None:
    m = TalkerModel.from_checkpoint(CKPT / name)
    with safe_open(str(CKPT / name / "model.safetensors"), "pt") as fh:
        file_keys = {k[len("talker.") :] for k in fh.keys() if k.startswith("talker.")}
    assert set(m.talker.state_dict()) == file_keys
    assert all(p.dtype == torch.float32 for p in m.talker.parameters())


# --- the talker's own checks (what depends on its checkpoint) --------------------------------------

_MODELS: dict[str, TalkerModel] = {}


def _model(name: str) -> TalkerModel:
    if name not in _MODELS:
        _MODELS[name] = TalkerModel.from_checkpoint(CKPT / name)
    return _MODELS[name]


H = 64  # tiny talker hidden size


def _talker_request(ref_frames: int = 0, ref_groups: int = 16, **fields) -> stages_pb2.TalkerRequest:
    msg = stages_pb2.TalkerRequest(text="hi", **fields)
    if ref_frames:
        msg.ref_codes.CopyFrom(codes_to_proto(np.zeros((ref_frames, ref_groups), np.int64)))
    return msg


def _inputs(name: str, msg: stages_pb2.TalkerRequest):
    model = _model(name)
    return engine_inputs(msg, talker_info(model, EngineConfig(max_seq_len=256)), model)


@pytest.mark.parametrize(
    "name, fields, match",
    [
        ("tiny_custom_voice", {"speaker": "nobody"}, "unknown speaker 'nobody'"),
        ("tiny_custom_voice", {}, "speaker is required for custom_voice models"),
        ("tiny_custom_voice", {"speaker": "ryan", "language": "klingon"}, "unknown language 'klingon'"),
        ("tiny_custom_voice", {"speaker": "dylan", "language": "beijing_dialect"}, "unknown language"),
        ("tiny_custom_voice", {"speaker": "ryan", "instruct": "sad"}, "instruct is not supported"),
        ("tiny_voice_design", {"speaker": "ryan"}, "preset speakers need a custom_voice model"),
        ("tiny_voice_design", {"speaker_embedding": [0.0] * H}, "voice cloning .* needs a base model"),
        ("tiny_base", {"speaker": "ryan"}, "preset speakers need a custom_voice model"),
        ("tiny_base", {}, "a voice is required for base models"),
        ("tiny_base", {"speaker_embedding": [0.0] * H, "instruct": "x"}, "instruct is not supported"),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "ref_text": "ref"},
            "ref_text was given without ref_codes",
        ),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "ref_frames": 3},
            "ref_text .* is required with ref_codes",
        ),
        ("tiny_base", {"ref_frames": 3, "ref_text": "r"}, "a voice is required"),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "ref_frames": 3, "ref_groups": 8, "ref_text": "r"},
            r"ref_codes must have shape \[frames>=1, 16\], got \(3, 8\)",
        ),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "sampling": tts_pb2.SamplingOptions(temperature=0)},
            "temperature",
        ),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "sampling": tts_pb2.SamplingOptions(max_new_tokens=1)},
            r"\[2, 256\]",
        ),
        (
            "tiny_base",
            {"speaker_embedding": [0.0] * H, "sampling": tts_pb2.SamplingOptions(max_new_tokens=257)},
            r"\[2, 256\]",
        ),
    ],
)
def test_invalid_talker_requests(name: str, fields: dict, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        _inputs(name, _talker_request(**fields))


def test_embedding_of_another_model_is_a_failed_precondition() -> None:
    with pytest.raises(
        FailedPreconditionError, match="speaker_embedding has 7 values but the talker's model needs 64"
    ):
        _inputs("tiny_base", _talker_request(speaker_embedding=[0.0] * 7))


def test_talker_request_translation() -> None:
    inputs, sampling, budget = _inputs(
        "tiny_custom_voice", _talker_request(speaker="RyAn", language="ENGLISH")
    )
    assert (inputs.speaker, inputs.language, inputs.non_streaming_text, budget) == (
        "ryan",
        "english",
        True,
        None,
    )
    assert sampling == _model("tiny_custom_voice").config.generation.sampling  # checkpoint defaults
    msg = _talker_request(
        speaker_embedding=[0.0] * H,
        ref_frames=2,
        ref_text="r",
        sampling=tts_pb2.SamplingOptions(seed=5, top_k=3, max_new_tokens=40),
    )
    inputs, sampling, budget = _inputs("tiny_base", msg)
    assert inputs.ref_codes.shape == (2, 16) and not inputs.non_streaming_text  # base: streaming text
    assert (sampling.seed, sampling.top_k, budget) == (5, 3, 40)
    inputs, _, _ = _inputs("tiny_custom_voice_1b7", _talker_request(speaker="ryan", instruct="calm"))
    assert inputs.instruct == "calm"


def test_dialect_and_default_streaming() -> None:
    m = TalkerModel.from_checkpoint(CKPT / "tiny_custom_voice")
    tc = m.config.model.talker
    zh = m.build_prompt(
        PromptInputs(text="你好", non_streaming_text=True, speaker="eric", language="chinese")
    )
    en = m.build_prompt(
        PromptInputs(text="你好", non_streaming_text=True, speaker="eric", language="english")
    )
    with torch.no_grad():
        dialect = m.talker.codec_embed(torch.tensor(tc.codec_language_id["sichuan_dialect"]))
        english = m.talker.codec_embed(torch.tensor(tc.codec_language_id["english"]))
    # codec-track position 2 of the head (role is 3 positions) carries the language id
    tts_pad = zh.tts_pad
    torch.testing.assert_close(zh.prefill[3 + 2] - tts_pad, dialect, rtol=0, atol=1e-6)
    torch.testing.assert_close(en.prefill[3 + 2] - tts_pad, english, rtol=0, atol=1e-6)
    # non-streaming feeding: one trailing row; streaming: the text after its first token
    assert zh.trailing.shape[0] == 1
    base = TalkerModel.from_checkpoint(CKPT / "tiny_base")
    p = base.build_prompt(
        PromptInputs(
            text="Hello world, this is a test.",
            non_streaming_text=False,
            language="english",
            speaker_embedding=np.zeros(H),
        )
    )
    assert p.trailing.shape[0] == p.text_tokens and p.prefill_len == 10


# --- sampling processors --------------------------------------------------------------------------


def test_talker_processors_match_transformers() -> None:
    from transformers.generation.logits_process import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SuppressTokensLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    vocab, eos = 3072, 2150
    logits = torch.randn(2, vocab, generator=g) * 3
    history = torch.randint(0, 2048, (2, 6), generator=g)
    presence = torch.zeros(2, vocab, dtype=torch.bool).scatter_(1, history, True)
    suppress = suppress_mask(vocab, eos, "cpu")
    for n_gen in (0, 1, 2, 6):
        ids = history[:, :n_gen]
        pres = (
            torch.zeros(2, vocab, dtype=torch.bool).scatter_(1, ids, True)
            if n_gen
            else torch.zeros_like(presence)
        )
        want = RepetitionPenaltyLogitsProcessor(1.05)(ids, logits.clone())
        want = MinNewTokensLengthLogitsProcessor(0, 2, eos)(ids, want)
        want = SuppressTokensLogitsProcessor([i for i in range(vocab - 1024, vocab) if i != eos])(ids, want)
        got = apply_talker_penalties(
            logits, pres, torch.full((2,), n_gen), torch.full((2,), 1.05), eos, suppress
        )
        assert torch.equal(got, want)
    warped = TopPLogitsWarper(0.8)(
        None, TopKLogitsWarper(50)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
    )
    got = warp_for_sampling(logits, torch.full((2,), 0.7), torch.full((2,), 50), torch.full((2,), 0.8))
    assert torch.equal(torch.isinf(got), torch.isinf(warped))
    torch.testing.assert_close(got[~torch.isinf(got)], warped[~torch.isinf(warped)])
    # top_k 0 / top_p 1.0 disable; greedy rows ignore noise
    off = warp_for_sampling(logits, torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2))
    assert torch.equal(off, logits)
    noise = torch.randn(2, vocab, generator=g) * 100
    greedy = choose_tokens(
        logits, torch.tensor([False, True]), torch.ones(2), torch.full((2,), 1), torch.ones(2), noise
    )
    assert greedy.tolist() == logits.argmax(-1).tolist()  # top_k=1 sampling == argmax too


def test_gumbel_sampling_follows_softmax() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(20000, 4)
    noise = gumbel_from_uniform_(torch.empty(20000, 4).uniform_(generator=g))  # the engine's noise
    n = 20000
    picks = choose_tokens(
        logits,
        torch.ones(n, dtype=torch.bool),
        torch.ones(n),
        torch.zeros(n, dtype=torch.long),
        torch.ones(n),
        noise,
    )
    freq = torch.bincount(picks, minlength=4).float() / n
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.015, rtol=0)


# --- decode step: slot modes, attend_len buckets, capturability -----------------------------------


@pytest.fixture(scope="module")
def cv17() -> TalkerModel:
    return TalkerModel.from_checkpoint(CKPT / "tiny_custom_voice_1b7")


def _prompts(m: TalkerModel):
    reqs = [
        PromptInputs(
            text="Hello world, this is a quick test.",
            non_streaming_text=True,
            language="english",
            speaker="ryan",
        ),
        PromptInputs(
            text="She said she would be here by noon.",
            language="english",
            speaker="serena",
            non_streaming_text=False,
        ),
    ]
    return [m.build_prompt(r) for r in reqs]


def _run(
    m: TalkerModel, slots: list[int], slot_mode: str, bucket: int | None, steps: int = 6
) -> torch.Tensor:
    prompts = _prompts(m)
    cache = m.allocate_cache(4, 96)
    cache.k.normal_()  # stale garbage from "earlier requests" must never be visible
    cache.v.normal_()
    params = SamplingTensors.stack([SamplingParams.greedy()], "cpu")
    st = DecodeState.cat([prefill(m.talker, cache, s, p.prefill, params) for s, p in zip(slots, prompts)])
    if slot_mode == "identity":
        st.slots = None
    out = []
    for step in range(steps):
        tr = torch.stack([p.trailing[step] if step < len(p.trailing) else p.tts_pad for p in prompts])
        need = int(st.positions.max()) + 1
        res = decode_step(m.talker, cache, st, tr, bucket or need)
        out.append(res.frame_codes)
    return torch.stack(out, 1)


def test_decode_step_slot_modes_agree(cv17: TalkerModel) -> None:
    ref = _run(cv17, [0, 1], "tensor", None)
    assert torch.equal(_run(cv17, [0, 1], "identity", None), ref)
    assert torch.equal(_run(cv17, [3, 1], "tensor", None), ref)
    assert torch.equal(_run(cv17, [2, 0], "tensor", 64), ref)  # bucketed attend_len, masked tail


def test_decode_step_traces_without_graph_breaks(cv17: TalkerModel) -> None:
    """fullgraph tracing fails on .item()/.tolist()/data-dependent Python branches: the step is
    free of host syncs and capturable (CUDA graphs) for fixed shapes."""
    prompts = _prompts(cv17)
    cache = cv17.allocate_cache(3, 96)
    params = SamplingTensors.stack([SamplingParams(seed=1), SamplingParams.greedy()], "cpu")
    rows = [
        prefill(cv17.talker, cache, s + 1, p.prefill, params.rows(slice(s, s + 1)))
        for s, p in enumerate(prompts)
    ]
    st = DecodeState.cat(rows)
    st2 = copy.deepcopy(st)
    cache2 = copy.deepcopy(cache)
    tr = torch.stack([p.trailing[0] for p in prompts])
    g = torch.Generator().manual_seed(0)
    tn = -torch.log(torch.empty(2, 3072).exponential_(generator=g))
    cn = -torch.log(torch.empty(2, 15, 2048).exponential_(generator=g))
    compiled = torch.compile(decode_step, backend="eager", fullgraph=True, dynamic=False)
    got = compiled(cv17.talker, cache, st, tr, 64, tn, cn)
    want = decode_step(cv17.talker, cache2, st2, tr, 64, tn, cn)
    assert torch.equal(got.frame_codes, want.frame_codes)
    assert torch.equal(got.next_code0, want.next_code0)
    assert torch.equal(st.positions, st2.positions) and torch.equal(st.presence, st2.presence)


def test_bfloat16_runs(cv17: TalkerModel) -> None:
    m = TalkerModel.from_checkpoint(CKPT / "tiny_custom_voice_1b7", dtype=torch.bfloat16)
    assert m.talker.codec_head.weight.dtype == torch.bfloat16
    inputs = PromptInputs(text="Hello there.", non_streaming_text=True, speaker="ryan")
    codes = generate(m, [inputs], 8, SamplingParams.greedy())[0].codes
    assert codes.shape == (7, 16) and int(codes.min()) >= 0 and int(codes.max()) < 2048
