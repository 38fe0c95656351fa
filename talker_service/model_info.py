"""What a loaded talker checkpoint offers, as the public ``ModelInfo`` / internal ``TalkerInfo``,
and the translation of a ``TalkerRequest`` into engine inputs after the checks that depend on the
checkpoint (``tts_common.synthesis.validation.check_talker_request``)."""

from __future__ import annotations

import numpy as np

from tts_common.codes import codes_from_proto
from tts_common.fingerprint import reported_fingerprint
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.pb.qwen3tts.v1 import tts_pb2
from tts_common.synthesis import SamplingParams, check_max_new_tokens, resolve_sampling, sampling_to_options
from tts_common.synthesis.validation import check_talker_request, resolve_language, resolve_text_feeding

from .engine import EngineConfig
from .model.loader import TalkerModel
from .model.prompt import PromptInputs


def model_info(model: TalkerModel) -> tts_pb2.ModelInfo:
    """What the loaded checkpoint offers (speakers, languages, instruct, defaults)."""
    cfg = model.config.model
    talker = cfg.talker
    st = model.config.speech_tokenizer
    gen = model.config.generation
    speakers = []
    for name in sorted(talker.spk_id):
        dialect = talker.spk_is_dialect.get(name)
        speakers.append(tts_pb2.PresetSpeaker(name=name, dialect=dialect if isinstance(dialect, str) else ""))
    languages = ["auto"] + sorted(k for k in talker.codec_language_id if "dialect" not in k)
    default_sampling = sampling_to_options(gen.sampling)
    default_sampling.max_new_tokens = gen.max_new_tokens
    return tts_pb2.ModelInfo(
        model_type=cfg.tts_model_type or "",
        model_size=cfg.tts_model_size or "",
        model_name=model.config.path.name,
        sample_rate=st.output_sample_rate,
        frame_rate=st.output_sample_rate / st.decode_upsample_rate,
        num_codebooks=talker.code_predictor.num_code_groups,
        speakers=speakers,
        languages=languages,
        instruct_supported=cfg.instruct_supported,
        voice_clone_supported=cfg.tts_model_type == "base",
        default_sampling=default_sampling,
        dtype=str(model.dtype).removeprefix("torch."),
    )


def talker_info(
    model: TalkerModel, config: EngineConfig, step_path: str = "eager", fallback_reason: str = ""
) -> stages_pb2.TalkerInfo:
    """The talker's model and limits (``Talker.GetModelInfo``); ``step_path`` and
    ``fallback_reason`` as the engine's graph-path self-check left them."""
    info = model_info(model)
    # Largest accepted max_new_tokens: a request's prompt and frames share one KV slot.
    info.max_new_tokens_limit = config.max_seq_len
    return stages_pb2.TalkerInfo(
        model=info,
        max_batch_size=config.max_slots,
        max_seq_len=config.max_seq_len,
        speaker_embedding_dim=model.config.model.talker.hidden_size,
        device=config.device,
        dtype=config.dtype,
        speech_tokenizer=reported_fingerprint(model.config.path),
        step_path=step_path,
        fallback_reason=fallback_reason,
    )


def engine_inputs(
    msg: stages_pb2.TalkerRequest, info: stages_pb2.TalkerInfo, model: TalkerModel
) -> tuple[PromptInputs, SamplingParams, int | None]:
    """(prompt inputs, sampling, max_new_tokens) of a ``TalkerRequest``, after the checks that
    depend on this checkpoint (InvalidRequestError with the gateway's messages otherwise)."""
    ref_codes = (
        codes_from_proto(msg.ref_codes) if msg.HasField("ref_codes") and msg.ref_codes.num_frames else None
    )
    check_talker_request(msg, info, ref_codes, model.config.model.talker.code_predictor.vocab_size)
    embedding = np.asarray(msg.speaker_embedding, dtype=np.float32) if len(msg.speaker_embedding) else None
    feeding = resolve_text_feeding(msg.text_feeding, info.model)
    inputs = PromptInputs(
        text=msg.text,
        non_streaming_text=feeding == tts_pb2.TEXT_FEEDING_NON_STREAMING,
        language=resolve_language(msg.language, info.model),
        speaker=msg.speaker.strip().lower() or None,
        instruct=msg.instruct or None,
        speaker_embedding=embedding,
        ref_codes=ref_codes,
        ref_text=msg.ref_text or None,
    )
    sampling = resolve_sampling(msg.sampling, model.config.generation.sampling)
    max_new_tokens = None
    if msg.sampling.HasField("max_new_tokens"):
        max_new_tokens = msg.sampling.max_new_tokens
        check_max_new_tokens(max_new_tokens, info.model.max_new_tokens_limit)  # the slot's limit
    return inputs, sampling, max_new_tokens
