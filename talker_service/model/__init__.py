"""Talker stage model code: tokenizer, talker + code predictor, prompts, sampling, generation."""

from .generate import FrameEvent, generate, iter_frames
from .loader import TalkerModel
from .prompt import InvalidRequestError, SynthesisRequest, TalkerPrompt, build_prompt, validate_request
from .sampling import RequestNoise, SamplingParams, SamplingTensors
from .step import DecodeState, StepOutput, decode_step, predict_residual_codes, prefill
from .talker import KVCache, Talker
from .tokenizer import TextTokenizer

__all__ = [
    "DecodeState",
    "FrameEvent",
    "InvalidRequestError",
    "KVCache",
    "RequestNoise",
    "SamplingParams",
    "SamplingTensors",
    "StepOutput",
    "SynthesisRequest",
    "Talker",
    "TalkerModel",
    "TalkerPrompt",
    "TextTokenizer",
    "build_prompt",
    "decode_step",
    "generate",
    "iter_frames",
    "predict_residual_codes",
    "prefill",
    "validate_request",
]
