"""Request validation and talker prompt construction for every mode (ARCHITECTURE.md §4).

Output of :func:`build_prompt`: the prefill input embeddings [P, H] (text track + codec track
summed per position, instruct prepended) and the trailing text rows [T, H] fed one per decode
step (tts_pad once exhausted). Speaker x-vectors and ICL reference codes are *inputs* here (the
speaker stage computes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from tts_common.config import Qwen3TTSConfig
from tts_common.errors import InvalidRequestError

from .talker import Talker
from .tokenizer import TextTokenizer

Mode = Literal["custom_voice", "voice_design", "voice_clone_xvector", "voice_clone_icl"]


@dataclass
class SynthesisRequest:
    """One utterance to synthesise. Which fields apply depends on the checkpoint type:

    * ``custom_voice``: ``speaker`` (required), ``instruct`` (1.7B only);
    * ``voice_design``: ``instruct`` (optional, "" = none);
    * ``base`` (voice clone): ``speaker_embedding`` (x-vector [H], required); with ``ref_codes``
      [frames, G] and ``ref_text`` the in-context-learning mode, without them x-vector only.

    ``language``: a language of the checkpoint or "auto" (case-insensitive).
    ``non_streaming_text``: None = official default (custom_voice / voice_design True, base False).
    """

    text: str
    language: str = "auto"
    speaker: str | None = None
    instruct: str | None = None
    non_streaming_text: bool | None = None
    speaker_embedding: torch.Tensor | np.ndarray | None = None
    ref_codes: torch.Tensor | np.ndarray | None = None
    ref_text: str | None = None


@dataclass
class TalkerPrompt:
    """Talker inputs of one request."""

    prefill: torch.Tensor
    """[P, H] prefill input embeddings."""
    trailing: torch.Tensor
    """[T, H] trailing text rows (T >= 1)."""
    tts_pad: torch.Tensor
    """[H] the row fed once ``trailing`` is exhausted."""
    mode: Mode
    input_ids: list[int] = field(default_factory=list)
    instruct_ids: list[int] | None = None
    ref_ids: list[int] | None = None

    @property
    def prefill_len(self) -> int:
        return self.prefill.shape[0]

    def trailing_row(self, step: int) -> torch.Tensor:
        """[H] text row fed at decode step ``step``: ``trailing[step]``, tts_pad once exhausted."""
        return self.trailing[step] if step < self.trailing.shape[0] else self.tts_pad


def default_non_streaming(tts_model_type: str | None) -> bool:
    """Official per-type default: custom_voice / voice_design non-streaming, base streaming."""
    return tts_model_type != "base"


def _norm_language(cfg: Qwen3TTSConfig, language: str | None) -> str:
    lang = (language or "auto").strip().lower()
    if lang == "auto":
        return lang
    table = cfg.talker.codec_language_id
    if lang not in table or "dialect" in lang:
        allowed = sorted(k for k in table if "dialect" not in k)
        raise InvalidRequestError(f"unsupported language {language!r}; expected 'auto' or one of {allowed}")
    return lang


def validate_request(cfg: Qwen3TTSConfig, req: SynthesisRequest) -> Mode:
    """Check ``req`` against the checkpoint; returns the mode or raises InvalidRequestError."""
    kind = cfg.tts_model_type
    if not isinstance(req.text, str) or not req.text.strip():
        raise InvalidRequestError("text must be a non-empty string")
    _norm_language(cfg, req.language)
    has_instruct = bool(req.instruct)
    if has_instruct and not cfg.instruct_supported:
        raise InvalidRequestError(
            f"instruct is not supported by this checkpoint (tts_model_type={kind}, "
            f"tts_model_size={cfg.tts_model_size})"
        )
    if kind == "custom_voice":
        if not req.speaker:
            raise InvalidRequestError("speaker is required for a custom_voice checkpoint")
        if req.speaker.strip().lower() not in cfg.talker.spk_id:
            raise InvalidRequestError(
                f"unknown speaker {req.speaker!r}; expected one of {sorted(cfg.talker.spk_id)}"
            )
    elif req.speaker:
        raise InvalidRequestError(f"speaker is not supported by a {kind} checkpoint")
    if kind != "base":
        if req.speaker_embedding is not None or req.ref_codes is not None or req.ref_text:
            raise InvalidRequestError(
                f"voice-clone inputs (speaker embedding, reference) need a base checkpoint, not {kind}"
            )
    if req.ref_text and req.ref_codes is None:
        raise InvalidRequestError("ref_text was given without reference codes (ICL needs both)")
    if kind == "custom_voice":
        return "custom_voice"
    if kind == "voice_design":
        return "voice_design"
    if kind != "base":
        raise InvalidRequestError(f"unsupported checkpoint type {kind!r}")
    if req.speaker_embedding is None:
        raise InvalidRequestError("voice clone needs a speaker embedding (x-vector)")
    emb = torch.as_tensor(req.speaker_embedding)
    if emb.numel() != cfg.talker.hidden_size:
        raise InvalidRequestError(
            f"speaker embedding has {emb.numel()} values, expected {cfg.talker.hidden_size}"
        )
    if req.ref_codes is None:
        return "voice_clone_xvector"
    if not req.ref_text:
        raise InvalidRequestError("ICL voice clone needs ref_text with the reference codes")
    codes = torch.as_tensor(req.ref_codes)
    groups = cfg.talker.code_predictor.num_code_groups
    if codes.ndim != 2 or codes.shape[1] != groups or codes.shape[0] < 1:
        raise InvalidRequestError(
            f"ref codes must have shape [frames>=1, {groups}], got {tuple(codes.shape)}"
        )
    if (
        codes.dtype.is_floating_point
        or int(codes.min()) < 0
        or int(codes.max()) >= cfg.talker.code_predictor.vocab_size
    ):
        raise InvalidRequestError("ref codes must be integers in [0, codebook size)")
    return "voice_clone_icl"


@torch.inference_mode()
def build_prompt(
    talker: Talker, tokenizer: TextTokenizer, cfg: Qwen3TTSConfig, req: SynthesisRequest
) -> TalkerPrompt:
    """Validate ``req`` and build its prefill embeddings and trailing text rows.

    The grouping of the text-projection calls follows the reference (projection results of a
    Linear can depend on how many rows are projected together).
    """
    mode = validate_request(cfg, req)
    tc = talker.cfg
    device = talker.codec_head.weight.device

    def ids_tensor(ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.int64, device=device)

    def T(ids: list[int]) -> torch.Tensor:  # noqa: N802 - ARCHITECTURE.md §4 notation
        return talker.text_embed(ids_tensor(ids))

    def C(ids: list[int]) -> torch.Tensor:  # noqa: N802 - ARCHITECTURE.md §4 notation
        return talker.codec_embed(ids_tensor(ids))

    non_streaming = req.non_streaming_text
    if non_streaming is None:
        non_streaming = default_non_streaming(cfg.tts_model_type)

    input_ids = tokenizer.synthesis_ids(req.text)
    if len(input_ids) < 9:
        raise InvalidRequestError("text produced no tokens")
    text_ids = input_ids[3:-5]

    tts_bos, tts_eos, tts_pad = T([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]).chunk(
        3, dim=1
    )

    # Codec prefix: think/language tokens, optional speaker vector, then pad + bos.
    language = _norm_language(cfg, req.language)
    speaker = req.speaker.strip().lower() if req.speaker else None
    lang_id: int | None = None if language == "auto" else tc.codec_language_id[language]
    if speaker is not None and language in ("chinese", "auto"):
        dialect = tc.spk_is_dialect.get(speaker)
        if isinstance(dialect, str) and dialect:
            lang_id = tc.codec_language_id[dialect.lower()]
    if lang_id is None:
        prefix_ids = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
    else:
        prefix_ids = [tc.codec_think_id, tc.codec_think_bos_id, lang_id, tc.codec_think_eos_id]
    spk: torch.Tensor | None = None
    if mode == "custom_voice":
        assert speaker is not None
        spk = C([tc.spk_id[speaker]])
    elif mode in ("voice_clone_xvector", "voice_clone_icl"):
        assert req.speaker_embedding is not None
        dtype = talker.codec_head.weight.dtype
        spk = torch.as_tensor(req.speaker_embedding).to(device=device, dtype=dtype).reshape(1, 1, -1)
    codec_parts = (
        [C(prefix_ids)] + ([spk] if spk is not None else []) + [C([tc.codec_pad_id, tc.codec_bos_id])]
    )
    codec_prefix = torch.cat(codec_parts, dim=1)
    n = codec_prefix.shape[1]

    role = T(input_ids[:3])
    head = torch.cat([tts_pad.expand(-1, n - 2, -1), tts_bos], dim=1) + codec_prefix[:, :-1]
    parts = [role, head]

    ref_ids: list[int] | None = None
    if mode == "voice_clone_icl":
        assert req.ref_text is not None and req.ref_codes is not None
        ref_ids = tokenizer.ref_ids(req.ref_text)
        text = torch.cat([T(ref_ids[3:-2] + text_ids), tts_eos], dim=1)
        ref_codes = torch.as_tensor(req.ref_codes).to(device=device, dtype=torch.int64)
        codec = torch.cat([C([tc.codec_bos_id]), talker.frame_embed(ref_codes)[None]], dim=1)
        lt, lc = text.shape[1], codec.shape[1]
        if non_streaming:
            parts.append(torch.cat([text + C([tc.codec_pad_id] * lt), codec + tts_pad], dim=1))
            trailing = tts_pad
        elif lt > lc:
            parts.append(text[:, :lc] + codec)
            trailing = text[:, lc:]
        else:
            parts.append(torch.cat([text, tts_pad.expand(-1, lc - lt, -1)], dim=1) + codec)
            trailing = tts_pad
    elif non_streaming:
        body = torch.cat([T(text_ids), tts_eos], dim=1) + C([tc.codec_pad_id] * (len(text_ids) + 1))
        parts += [body, tts_pad + C([tc.codec_bos_id])]
        trailing = tts_pad
    else:
        parts.append(T(input_ids[3:4]) + C([tc.codec_bos_id]))
        trailing = torch.cat([T(input_ids[4:-5]), tts_eos], dim=1) if len(input_ids) > 9 else tts_eos

    instruct_ids: list[int] | None = None
    if req.instruct:
        instruct_ids = tokenizer.instruct_ids(req.instruct)
        parts.insert(0, T(instruct_ids))

    prefill = torch.cat(parts, dim=1)[0]
    return TalkerPrompt(
        prefill=prefill,
        trailing=trailing[0],
        tts_pad=tts_pad[0, 0],
        mode=mode,
        input_ids=input_ids,
        instruct_ids=instruct_ids,
        ref_ids=ref_ids,
    )
