"""Talker stage model code: tokenizer, talker + code predictor, prompts, sampling, one decode step
(the decode loop is the engine's, :mod:`talker_service.engine`)."""

from tts_common.text.tokenizer import TextTokenizer

from .loader import TalkerModel
from .prompt import PromptInputs, TalkerPrompt, build_prompt
from .sampling import RequestNoise, SamplingTensors
from .step import DecodeState, StepOutput, decode_step, predict_residual_codes, prefill, prefill_prompts
from .talker import KVCache, Talker

__all__ = [
    "DecodeState",
    "KVCache",
    "PromptInputs",
    "RequestNoise",
    "SamplingTensors",
    "StepOutput",
    "Talker",
    "TalkerModel",
    "TalkerPrompt",
    "TextTokenizer",
    "build_prompt",
    "decode_step",
    "predict_residual_codes",
    "prefill",
    "prefill_prompts",
]
