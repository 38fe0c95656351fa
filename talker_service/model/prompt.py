"""Talker prompt construction for every mode (ARCHITECTURE.md §4).

Output of :func:`build_prompt`: the prefill input embeddings [P, H] (text track + codec track
summed per position, instruct prepended) and the trailing text rows [T, H] fed one per decode
step (tts_pad once exhausted). Speaker x-vectors and ICL reference codes are *inputs* here (the
speaker stage computes them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tts_common.config import Qwen3TTSConfig
from tts_common.errors import InvalidRequestError
from tts_common.text.tokenizer import ROLE_TOKENS, TAIL_TOKENS, TextTokenizer

from .talker import Talker


@dataclass
class PromptInputs:
    """What one utterance's talker prompt is built from, already validated against the checkpoint
    (``tts_common.synthesis.validation.check_talker_request``; the model code trusts it).

    * ``speaker``: lower-cased preset speaker (custom_voice), else None;
    * ``instruct``: instruction text (voice_design; 1.7B custom_voice), else None;
    * ``speaker_embedding`` (x-vector [H]): voice clone (base); with ``ref_codes`` [frames, G] and
      ``ref_text`` the in-context mode, without them x-vector only;
    * ``language``: lower-cased language of the checkpoint, or "auto";
    * ``non_streaming_text``: the text feeding (``tts_common.synthesis.validation`` resolves the
      official per-type default).
    """

    text: str
    non_streaming_text: bool
    language: str = "auto"
    speaker: str | None = None
    instruct: str | None = None
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
    text_tokens: int
    """Tokens of the utterance's text (the runaway guard's measure)."""
    tts_eos: torch.Tensor | None = None
    """[H] the row that ends the text: set while the text is open (appended by
    :func:`end_text`), None once it is in ``trailing`` (or the mode feeds no trailing text)."""

    @property
    def prefill_len(self) -> int:
        return self.prefill.shape[0]

    def trailing_row(self, step: int) -> torch.Tensor:
        """[H] text row fed at decode step ``step``: ``trailing[step]``, tts_pad once exhausted."""
        return self.trailing[step] if step < self.trailing.shape[0] else self.tts_pad


def reference_text_ids(tokenizer: TextTokenizer, ref_text: str) -> list[int]:
    """The in-context reference transcript's tokens as they precede the text."""
    return tokenizer.ref_ids(ref_text)[3:-2]


def tokens_to_start(tokenizer: TextTokenizer, req: PromptInputs) -> int | None:
    """Text tokens a request whose text is still open needs before its prompt can be built
    (``build_prompt(..., text_open=True)``): None when it needs the whole text (non-streaming
    feeding puts all of it in the prompt).

    Streaming feeding puts the first text token in the prompt. The in-context clone's prompt
    pairs the reference transcript + text tokens with ``1 + reference frames`` codec rows
    (ARCHITECTURE.md §4), so that many must be known.
    """
    if req.non_streaming_text:
        return None
    if req.ref_codes is not None:
        assert req.ref_text is not None
        codec_rows = 1 + int(np.asarray(req.ref_codes).shape[0])
        return max(1, codec_rows - len(reference_text_ids(tokenizer, req.ref_text)))
    return 1


@torch.inference_mode()
def build_prompt(
    talker: Talker,
    tokenizer: TextTokenizer,
    cfg: Qwen3TTSConfig,
    req: PromptInputs,
    text_ids: list[int] | None = None,
    text_open: bool = False,
    role_ids: list[int] | None = None,
) -> TalkerPrompt:
    """Build the prefill embeddings and trailing text rows of ``req`` (validated by the caller;
    InvalidRequestError only if the text tokenizes to nothing).

    ``text_ids`` and ``role_ids``: the text's and role's tokens when they were tokenized
    elsewhere (incrementally: ``IncrementalTokenizer``), else from ``req.text``. ``text_open``: more tokens follow (:func:`append_text`,
    then :func:`end_text`): the prompt is that of the whole text cut where the known tokens end,
    so it needs :func:`tokens_to_start` tokens.

    The grouping of the text-projection calls follows the reference (projection results of a
    Linear can depend on how many rows are projected together).
    """
    tc = talker.cfg
    device = talker.codec_head.weight.device

    def ids_tensor(ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.int64, device=device)

    def T(ids: list[int]) -> torch.Tensor:  # noqa: N802 - ARCHITECTURE.md §4 notation
        return talker.text_embed(ids_tensor(ids))

    def C(ids: list[int]) -> torch.Tensor:  # noqa: N802 - ARCHITECTURE.md §4 notation
        return talker.codec_embed(ids_tensor(ids))

    non_streaming = req.non_streaming_text
    if text_ids is None or role_ids is None:
        input_ids = tokenizer.synthesis_ids(req.text)
        role_ids, text_ids = input_ids[:ROLE_TOKENS], input_ids[ROLE_TOKENS:-TAIL_TOKENS]
    if not text_ids:
        raise InvalidRequestError("text produced no tokens")
    if text_open:
        needed = tokens_to_start(tokenizer, req)
        if needed is None or len(text_ids) < needed:
            raise ValueError(f"an open text needs {needed} tokens to start, got {len(text_ids)}")

    tts_bos, tts_eos, tts_pad = T([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]).chunk(
        3, dim=1
    )

    # Codec prefix: think/language tokens, optional speaker vector, then pad + bos.
    language, speaker = req.language, req.speaker
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
    if speaker is not None:
        spk = C([tc.spk_id[speaker]])
    elif req.speaker_embedding is not None:
        dtype = talker.codec_head.weight.dtype
        spk = torch.as_tensor(req.speaker_embedding).to(device=device, dtype=dtype).reshape(1, 1, -1)
    codec_parts = (
        [C(prefix_ids)] + ([spk] if spk is not None else []) + [C([tc.codec_pad_id, tc.codec_bos_id])]
    )
    codec_prefix = torch.cat(codec_parts, dim=1)
    n = codec_prefix.shape[1]

    role = T(role_ids)
    head = torch.cat([tts_pad.expand(-1, n - 2, -1), tts_bos], dim=1) + codec_prefix[:, :-1]
    parts = [role, head]

    if req.ref_codes is not None:
        assert req.ref_text is not None
        known = T(reference_text_ids(tokenizer, req.ref_text) + text_ids)
        text = known if text_open else torch.cat([known, tts_eos], dim=1)
        ref_codes = torch.as_tensor(req.ref_codes).to(device=device, dtype=torch.int64)
        codec = torch.cat([C([tc.codec_bos_id]), talker.frame_embed(ref_codes)[None]], dim=1)
        lt, lc = text.shape[1], codec.shape[1]
        if non_streaming:
            parts.append(torch.cat([text + C([tc.codec_pad_id] * lt), codec + tts_pad], dim=1))
            trailing = tts_pad
        elif lt > lc or text_open:  # open: lt >= lc (tokens_to_start), the eos still to come
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
        parts.append(T(text_ids[:1]) + C([tc.codec_bos_id]))
        if text_open:
            trailing = T(text_ids[1:]) if len(text_ids) > 1 else tts_eos[:, :0]
        else:
            trailing = torch.cat([T(text_ids[1:]), tts_eos], dim=1) if len(text_ids) > 1 else tts_eos

    if req.instruct:
        parts.insert(0, T(tokenizer.instruct_ids(req.instruct)))

    prefill = torch.cat(parts, dim=1)[0]
    return TalkerPrompt(
        prefill=prefill,
        trailing=trailing[0],
        tts_pad=tts_pad[0, 0],
        text_tokens=len(text_ids),
        tts_eos=tts_eos[0, 0] if text_open else None,
    )


@torch.inference_mode()
def append_text(talker: Talker, prompt: TalkerPrompt, text_ids: list[int]) -> None:
    """Add tokens of an open text to ``prompt``'s trailing rows."""
    if prompt.tts_eos is None:
        raise ValueError("the prompt's text has ended")
    if not text_ids:
        return
    ids = torch.tensor([text_ids], dtype=torch.int64, device=talker.codec_head.weight.device)
    rows = talker.text_embed(ids)[0].to(prompt.trailing.dtype)
    prompt.trailing = torch.cat([prompt.trailing, rows])
    prompt.text_tokens += len(text_ids)


def end_text(prompt: TalkerPrompt) -> None:
    """Close ``prompt``'s open text: ``tts_eos`` follows its last token."""
    if prompt.tts_eos is None:
        raise ValueError("the prompt's text has ended")
    prompt.trailing = torch.cat([prompt.trailing, prompt.tts_eos[None]])
    prompt.tts_eos = None
