"""Long texts as consecutive talker requests: how big a segment may be, the seed of each segment,
and the per-segment plans (:func:`plan_segments`), for the gateway and the offline command alike.

Segment size. One segment is one talker request, and a talker request must fit one KV slot of
``max_seq_len`` positions: its prompt and its frames. The prompt is the segment's text tokens plus
a part that does not depend on the text (:func:`prompt_overhead`: template and codec prefix,
the instruct, an in-context reference). Unless the client sets ``max_new_tokens``, the frame budget
is the runaway guard (``tts_common.synthesis.budget``: 125 frames + 10 per text token), capped to
what is left in the slot. The default segment size (:func:`max_segment_tokens`) is the largest for
which that budget fits whole, so the cap never applies: a segment is never cut short by the slot,
however slowly it is spoken, and a runaway still ends at the guard. With the default slot (2048
positions) and no instruct or reference that is (2048 - 1 - 11 - 125) // 11 = 173 tokens: a few
sentences, about 130 English words or 45 s of speech, within the 100-200 tokens the segmenter
recommends (``tts_common.text``: fewer prosody breaks than sentence by sentence, far from the
limits). A longer instruct or reference leaves less room, so segments get smaller.

Seeds. Segment 0 uses the request's seed, so a text that fits one segment is generated exactly as
before segmentation existed; segment k > 0 uses :func:`segment_seed` of it, so a request replays
identically and each segment can be re-synthesized alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tts_common.errors import InvalidRequestError
from tts_common.pb.qwen3tts.internal.v1 import stages_pb2
from tts_common.serving.request_ids import MAX_REQUEST_ID_CHARS
from tts_common.text import TokenCounter, segment_text
from tts_common.text.tokenizer import INSTRUCT_TEMPLATE, REF_TEMPLATE

from .budget import DEFAULT_SLOT_POSITIONS, RUNAWAY_GUARD, RunawayGuard
from .validation import SynthesisPlan

PROMPT_FIXED_POSITIONS = 11
"""Prompt positions besides the text tokens, the instruct and an in-context reference, at most
(``talker_service.model.prompt.build_prompt``): the role tokens (3), the codec prefix shifted by
one (think, think-bos, language, think-eos, speaker, pad: 6), the text-end row and the row
carrying the codec BOS (2). A talker test pins this bound against the real prompts."""

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def segment_seed(seed: int, index: int) -> int:
    """The seed of segment ``index`` of a request whose seed is ``seed``: the seed itself for
    segment 0; for k > 0, SplitMix64's output for the state ``seed + k * 0x9E3779B97F4A7C15``
    (modulo 2**64), its top 31 bits (below 2**31 like the seeds the server draws, so every RNG
    API and JSON client takes it)."""
    if index == 0:
        return seed
    z = (seed + index * _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z >> 33


def segment_request_id(request_id: str, index: int) -> str:
    """The talker/decoder request id of segment ``index``: ``request_id`` for segment 0 (so a
    single segment looks as before), ``request_id/k`` after it, the id shortened if the suffix
    would exceed the request-id length limit."""
    if index == 0:
        return request_id
    suffix = f"/{index}"
    return request_id[: MAX_REQUEST_ID_CHARS - len(suffix)] + suffix


def prompt_overhead(
    count_tokens: TokenCounter, *, instruct: str = "", ref_text: str = "", ref_frames: int = 0
) -> int:
    """Upper bound of a prompt's positions besides its text tokens: :data:`PROMPT_FIXED_POSITIONS`,
    the instruct in its template, and for an in-context clone (``ref_frames`` > 0) the reference
    transcript in its template plus one position per reference frame."""
    positions = PROMPT_FIXED_POSITIONS
    if instruct:
        positions += count_tokens(INSTRUCT_TEMPLATE.format(instruct))
    if ref_frames > 0:
        positions += count_tokens(REF_TEMPLATE.format(ref_text)) + ref_frames
    return positions


def max_segment_tokens(max_seq_len: int, overhead: int, guard: RunawayGuard = RUNAWAY_GUARD) -> int:
    """The largest segment, in text tokens T, whose prompt (T + ``overhead``) and runaway-guard
    budget (``guard.frames(T)``) fit a slot of ``max_seq_len`` positions (one kept spare, as the
    talker keeps it); 0 if not even one token fits."""
    room = max_seq_len - 1 - overhead - guard.base_frames
    # For T >= 1, T + overhead + guard.frames(T) + 1 <= max_seq_len is (1 + per token) * T <= room.
    return max(room // (1 + guard.frames_per_text_token), 0)


def segment_size(max_seq_len: int, overhead: int, configured: int = 0) -> int:
    """The segment size of a request: ``configured`` (0 = unset) but at most
    :func:`max_segment_tokens`. INVALID_ARGUMENT when the prompt's fixed part leaves no room."""
    largest = max_segment_tokens(max_seq_len, overhead)
    if largest < 1:
        raise InvalidRequestError(
            f"the instruct and voice reference take {overhead} prompt positions, which leaves no room "
            f"for text in a talker slot of {max_seq_len} positions (shorten the instruct or the reference)"
        )
    return min(configured, largest) if configured > 0 else largest


def request_segment_size(
    count_tokens: TokenCounter,
    plan: SynthesisPlan,
    *,
    ref_text: str = "",
    ref_codes: stages_pb2.Codes | None = None,
    max_seq_len: int = 0,
    configured: int = 0,
) -> int:
    """:func:`segment_size` of a request: its prompt overhead from ``plan``'s instruct and the
    resolved voice's in-context reference (``ref_text``, ``ref_codes``), in a talker slot of
    ``max_seq_len`` positions (0: :data:`~tts_common.synthesis.budget.DEFAULT_SLOT_POSITIONS`)."""
    ref_frames = ref_codes.num_frames if ref_codes is not None else 0
    overhead = prompt_overhead(count_tokens, instruct=plan.instruct, ref_text=ref_text, ref_frames=ref_frames)
    return segment_size(max_seq_len or DEFAULT_SLOT_POSITIONS, overhead, configured)


@dataclass(frozen=True)
class SegmentPlan:
    """One segment of a request: its place in the text and the plan it is synthesized with."""

    index: int
    start: int
    """Offset of the segment's text in the request's text (code points)."""
    end: int
    plan: SynthesisPlan
    """The request's plan with this segment's text and seed."""

    @property
    def seed(self) -> int:
        """The segment's seed (:func:`segment_seed`)."""
        seed = self.plan.sampling.seed
        assert seed is not None  # plan_synthesis always sets one
        return seed


def plan_segments(plan: SynthesisPlan, max_tokens: int, count_tokens: TokenCounter) -> list[SegmentPlan]:
    """The segments of ``plan``'s text (``tts_common.text.segment_text``: at most ``max_tokens``
    tokens each as ``count_tokens`` counts them), each with its derived seed. A text that fits one
    segment is that one segment, whole and unchanged (surrounding whitespace included).

    Raises NothingToSpeakError / WordTooLongError (INVALID_ARGUMENT)."""
    pieces = segment_text(plan.text, max_tokens, count_tokens)
    if len(pieces) == 1:
        return [SegmentPlan(0, 0, len(plan.text), plan)]
    return [segment_plan(plan, k, piece.start, piece.end, piece.text) for k, piece in enumerate(pieces)]


FIRST_SEGMENT_PREFIX_CHARS = 20
"""Characters of text per token of segment size that :func:`first_segment` reads: three
segments of English (about 4-5 characters a token) with room to spare."""


def first_segment(
    plan: SynthesisPlan, max_tokens: int, count_tokens: TokenCounter, prefix_chars: int | None = None
) -> SegmentPlan | None:
    """Segment 0 of :func:`plan_segments` (same arguments) from a prefix of the text, so a long
    text starts speaking without waiting for the whole text to be segmented (tens of
    milliseconds for a chapter). Exact: the packing is greedy from the start and a sentence end
    is decided by the characters next to it, so what the cut at the prefix's end changes is its
    last segments only; once the prefix holds three segments its first is final (a property
    test pins this). None when the prefix does not settle it (a text no longer than the prefix,
    fewer than three segments in it, or a prefix that does not segment): use
    :func:`plan_segments`'s first. ``prefix_chars``: the prefix's length (default
    ``max_tokens * FIRST_SEGMENT_PREFIX_CHARS``)."""
    if prefix_chars is None:
        prefix_chars = max_tokens * FIRST_SEGMENT_PREFIX_CHARS
    prefix = plan.text[:prefix_chars]
    if len(prefix) == len(plan.text):
        return None
    try:
        pieces = segment_text(prefix, max_tokens, count_tokens)
    except InvalidRequestError:  # decided on the whole text by plan_segments
        return None
    if len(pieces) < 3:
        return None
    return segment_plan(plan, 0, pieces[0].start, pieces[0].end, pieces[0].text)


def segment_plan(plan: SynthesisPlan, index: int, start: int, end: int, text: str) -> SegmentPlan:
    """Segment ``index`` of ``plan``: ``text`` (the request's text from ``start`` to ``end``)
    with the segment's seed (:func:`segment_seed`); the rest of the plan unchanged."""
    seed = plan.sampling.seed
    assert seed is not None  # plan_synthesis always sets one
    return SegmentPlan(
        index=index,
        start=start,
        end=end,
        plan=dataclasses.replace(
            plan, text=text, sampling=plan.sampling.replace(seed=segment_seed(seed, index))
        ),
    )


__all__ = [
    "PROMPT_FIXED_POSITIONS",
    "FIRST_SEGMENT_PREFIX_CHARS",
    "SegmentPlan",
    "first_segment",
    "max_segment_tokens",
    "plan_segments",
    "prompt_overhead",
    "request_segment_size",
    "segment_plan",
    "segment_request_id",
    "segment_seed",
    "segment_size",
]
