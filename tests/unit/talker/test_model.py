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

from talker_service.model import (
    DecodeState,
    InvalidRequestError,
    SamplingParams,
    SamplingTensors,
    SynthesisRequest,
    Talker,
    TalkerModel,
    decode_step,
    generate,
    prefill,
    validate_request,
)
from talker_service.model.sampling import (
    apply_talker_penalties,
    choose_tokens,
    suppress_mask,
    warp_for_sampling,
)
from tts_common.config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig, load_checkpoint_config

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


# --- request validation ---------------------------------------------------------------------------


def _cfg(name: str) -> Qwen3TTSConfig:
    return load_checkpoint_config(CKPT / name).model


H = 64  # tiny talker hidden size


@pytest.mark.parametrize(
    "name, req, match",
    [
        ("tiny_custom_voice", SynthesisRequest(text="hi", speaker="nobody"), "unknown speaker"),
        ("tiny_custom_voice", SynthesisRequest(text="hi"), "speaker is required"),
        ("tiny_custom_voice", SynthesisRequest(text="hi", speaker="ryan", language="klingon"), "language"),
        (
            "tiny_custom_voice",
            SynthesisRequest(text="hi", speaker="dylan", language="beijing_dialect"),
            "language",
        ),
        ("tiny_custom_voice", SynthesisRequest(text="hi", speaker="ryan", instruct="sad"), "instruct"),
        ("tiny_custom_voice", SynthesisRequest(text="   ", speaker="ryan"), "text"),
        ("tiny_custom_voice", SynthesisRequest(text="", speaker="ryan"), "text"),
        ("tiny_voice_design", SynthesisRequest(text="hi", speaker="ryan"), "speaker"),
        ("tiny_voice_design", SynthesisRequest(text="hi", speaker_embedding=np.zeros(H)), "base"),
        ("tiny_base", SynthesisRequest(text="hi", speaker="ryan", speaker_embedding=np.zeros(H)), "speaker"),
        ("tiny_base", SynthesisRequest(text="hi"), "speaker embedding"),
        ("tiny_base", SynthesisRequest(text="hi", speaker_embedding=np.zeros(H), instruct="x"), "instruct"),
        ("tiny_base", SynthesisRequest(text="hi", speaker_embedding=np.zeros(H), ref_text="ref"), "ref_text"),
        (
            "tiny_base",
            SynthesisRequest(text="hi", speaker_embedding=np.zeros(H), ref_codes=np.zeros((3, 16), np.int64)),
            "ref_text",
        ),
        (
            "tiny_base",
            SynthesisRequest(
                text="hi", speaker_embedding=np.zeros(H), ref_codes=np.zeros((3, 8), np.int64), ref_text="r"
            ),
            "shape",
        ),
        ("tiny_base", SynthesisRequest(text="hi", speaker_embedding=np.zeros(7)), "values"),
    ],
)
def test_invalid_requests(name: str, req: SynthesisRequest, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        validate_request(_cfg(name), req)
    assert issubclass(InvalidRequestError, ValueError)


def test_valid_request_modes_and_case_insensitivity() -> None:
    cv = _cfg("tiny_custom_voice")
    assert (
        validate_request(cv, SynthesisRequest(text="hi", speaker="RyAn", language="ENGLISH"))
        == "custom_voice"
    )
    assert (
        validate_request(cv, SynthesisRequest(text="hi", speaker="dylan", language="Auto")) == "custom_voice"
    )
    assert validate_request(cv, SynthesisRequest(text="hi", speaker="ryan", instruct="")) == "custom_voice"
    assert validate_request(
        _cfg("tiny_custom_voice_1b7"), SynthesisRequest(text="hi", speaker="ryan", instruct="calm")
    )
    base = _cfg("tiny_base")
    assert (
        validate_request(base, SynthesisRequest(text="hi", speaker_embedding=np.zeros(H)))
        == "voice_clone_xvector"
    )
    icl = SynthesisRequest(
        text="hi", speaker_embedding=np.zeros(H), ref_codes=np.zeros((2, 16), np.int64), ref_text="r"
    )
    assert validate_request(base, icl) == "voice_clone_icl"


def test_dialect_and_default_streaming() -> None:
    m = TalkerModel.from_checkpoint(CKPT / "tiny_custom_voice")
    tc = m.config.model.talker
    zh = m.build_prompt(SynthesisRequest(text="你好", speaker="eric", language="chinese"))
    en = m.build_prompt(SynthesisRequest(text="你好", speaker="eric", language="english"))
    with torch.no_grad():
        dialect = m.talker.codec_embed(torch.tensor(tc.codec_language_id["sichuan_dialect"]))
        english = m.talker.codec_embed(torch.tensor(tc.codec_language_id["english"]))
    # codec-track position 2 of the head (role is 3 positions) carries the language id
    tts_pad = zh.tts_pad
    torch.testing.assert_close(zh.prefill[3 + 2] - tts_pad, dialect, rtol=0, atol=1e-6)
    torch.testing.assert_close(en.prefill[3 + 2] - tts_pad, english, rtol=0, atol=1e-6)
    # defaults: custom_voice non-streaming (one trailing row), base streaming
    assert zh.trailing.shape[0] == 1
    base = TalkerModel.from_checkpoint(CKPT / "tiny_base")
    p = base.build_prompt(
        SynthesisRequest(
            text="Hello world, this is a test.", language="English", speaker_embedding=np.zeros(H)
        )
    )
    assert p.trailing.shape[0] > 1 and p.prefill_len == 10


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
    noise = -torch.log(torch.empty(20000, 4).exponential_(generator=g))
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


def test_sampling_params_validation() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=1.5)
    d = load_checkpoint_config(CKPT / "tiny_base").generation
    p = SamplingParams.from_defaults(d, temperature=0.5)
    assert p.do_sample and p.temperature == 0.5 and p.top_k == 50


# --- decode step: slot modes, attend_len buckets, capturability -----------------------------------


@pytest.fixture(scope="module")
def cv17() -> TalkerModel:
    return TalkerModel.from_checkpoint(CKPT / "tiny_custom_voice_1b7")


def _prompts(m: TalkerModel):
    reqs = [
        SynthesisRequest(text="Hello world, this is a quick test.", language="english", speaker="ryan"),
        SynthesisRequest(
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
    codes = generate(m, [SynthesisRequest(text="Hello there.", speaker="ryan")], 8, SamplingParams.greedy())[
        0
    ]
    assert codes.shape == (7, 16) and int(codes.min()) >= 0 and int(codes.max()) < 2048
