"""What long-text segmentation assumes of the talker: its prompts fit the bound
``tts_common.synthesis.segments.prompt_overhead`` + text tokens, the shared tokenizer counts the
talker's ``text_tokens``, and ``GetTokenizer`` serves the files that rebuild that tokenizer."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talker_service.engine import EngineConfig
from talker_service.model.loader import TalkerModel
from talker_service.server import TalkerServicer
from tests.helpers.fixtures import CHECKPOINT_NAMES, CKPT_DIR, fixture_prompt_inputs, load_requests
from tts_common.errors import UnavailableError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.synthesis.segments import PROMPT_FIXED_POSITIONS, prompt_overhead
from tts_common.text.tokenizer import TextTokenizer, read_tokenizer_files

_MODELS: dict[str, TalkerModel] = {}


def _model(name: str) -> TalkerModel:
    if name not in _MODELS:
        _MODELS[name] = TalkerModel.from_checkpoint(CKPT_DIR / name)
    return _MODELS[name]


def _check_bound(model: TalkerModel, inputs) -> int:
    """Assert the prompt of ``inputs`` fits the segmenter's bound; return the slack."""
    prompt = model.build_prompt(inputs)
    count = model.tokenizer.count_tokens
    assert count(inputs.text) == prompt.text_tokens
    ref_frames = 0 if inputs.ref_codes is None else int(np.asarray(inputs.ref_codes).shape[0])
    bound = prompt.text_tokens + prompt_overhead(
        count, instruct=inputs.instruct or "", ref_text=inputs.ref_text or "", ref_frames=ref_frames
    )
    assert prompt.prefill_len <= bound, (inputs.text, prompt.prefill_len, bound)
    return bound - prompt.prefill_len


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_fixture_prompts_fit_the_segment_bound(name: str) -> None:
    model = _model(name)
    slack = []
    for line in load_requests(name):
        inputs = fixture_prompt_inputs(name, line)
        # Both text feedings: the non-streaming one puts the whole text in the prefill.
        for non_streaming in (False, True):
            slack.append(_check_bound(model, dataclasses.replace(inputs, non_streaming_text=non_streaming)))
    if name == "tiny_custom_voice":
        # A preset speaker with a language, non-streaming: the bound is exact (not padded).
        assert min(slack) == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.lists(
        st.sampled_from([*"abc XYZ,.!?0123456789\n", "今天", "ありがとう", "é", "—", "<|im_end|>"]),
        min_size=1,
        max_size=40,
    )
    .map("".join)
    .filter(lambda t: any(c.isalnum() for c in t)),
    non_streaming=st.booleans(),
)
def test_any_text_fits_the_bound(text: str, non_streaming: bool) -> None:
    name = "tiny_voice_design"
    inputs = fixture_prompt_inputs(name, load_requests(name)[0])
    _check_bound(_model(name), dataclasses.replace(inputs, text=text, non_streaming_text=non_streaming))


def test_fixed_positions_match_the_prompt_layout() -> None:
    # role (3) + codec prefix shifted by one (think, think-bos, language, think-eos, speaker, pad:
    # 6) + text-end row + codec-BOS row (2).
    assert PROMPT_FIXED_POSITIONS == 3 + 6 + 2


def test_get_tokenizer_serves_the_talker_tokenizer() -> None:
    async def main() -> None:
        checkpoint = CKPT_DIR / "tiny_custom_voice"
        servicer = TalkerServicer(str(checkpoint), EngineConfig(max_slots=1, max_seq_len=64))
        with pytest.raises(UnavailableError):
            servicer._require()  # before loading: GetTokenizer answers UNAVAILABLE
        await servicer.load()
        try:
            reply = await servicer.GetTokenizer(stages_pb2.GetTokenizerRequest(), None)  # type: ignore[arg-type]
        finally:
            await servicer.close()
        assert dict(reply.files) == read_tokenizer_files(checkpoint)
        assert set(reply.files) == {"vocab.json", "merges.txt", "tokenizer_config.json"}
        rebuilt = TextTokenizer.from_files(dict(reply.files))
        talker = _model("tiny_custom_voice").tokenizer
        for text in ("Hello there, Dr. Smith.", "今天天气很好。", "<|im_start|>x", "3.14 e.g. www.a.org"):
            assert rebuilt.encode(text) == talker.encode(text)

    asyncio.run(main())
