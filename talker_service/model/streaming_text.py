"""Tokenizing a text that arrives in pieces: each token is *committed* once no continuation of the
text can change it, so the committed tokens of any split of a text into deltas are exactly
:meth:`TextTokenizer.text_ids` of the whole text (what a one-shot request speaks).

The tokenizer's pipeline (:mod:`.tokenizer`) and what each stage lets text arriving later change:

1. Added tokens (``<|im_end|>``, ...) are matched in the raw text, leftmost-longest. A text ending
   with a proper prefix of one (``"... <|im_"``) may still complete it: nothing from the earliest
   such start on is final. A complete match cuts the text into separately processed segments.
2. NFC normalisation of each segment. Appended text can recompose and reorder back to the last
   character that later text may interact with; :mod:`.unicode_boundaries` tells where it
   cannot (``boundary_before`` / ``boundary_after``). Only the normalised text up to the last
   such boundary ``c`` is final.
3. The Qwen2 split regex over the normalised segment, then byte-level BPE inside each pre-token.
   On a final normalised prefix ``N``, every pre-token but the last is final, with one exception:
   ``\\s*[\\r\\n]+`` backtracks to the last line break of a whitespace run, so a run at the very
   end (``"a\\n  "``, split ``a | \\n | "  "``) re-splits when a line break follows
   (``"a\\n  \\n"``: ``a | "\\n  \\n"``). The other alternatives either cannot fail for lack of
   input or, when they do, leave a single pre-token reaching the end (the last one). Hence
   the rule: a pre-token boundary ``b`` of ``N`` is final when it is not after the start of the
   last pre-token and the character before it is not whitespace (the regex's ``\\s``, read
   generously: :func:`is_split_space`). The tests check this rule against the tokenizer itself.

Committing up to such a boundary is committing at a point where normalisation, the split and
added-token matching all restart, so the rest of the text is tokenized on its own from there
(``_pending``): the work per delta is proportional to the uncommitted tail, not to the text.

The start of the text shares its segment with the role text ``assistant\\n`` before it (the
official prompt tokenizes the text inside its chat template), so the first piece is tokenized
through :meth:`TextTokenizer.text_ids` and the rule is applied with that role text in front.
"""

from __future__ import annotations

from tts_common.text.tokenizer import ROLE_SEGMENT, ROLE_TOKENS, TAIL_TOKENS, TextTokenizer, TokenizerError

from .unicode_boundaries import boundary_after, boundary_before, is_split_space


class IncrementalTokenizer:
    """Text deltas in, committed token ids out (see the module docstring).

    ``push(delta)`` returns the tokens that became final; ``finish()`` the rest at the end of the
    text. The concatenation of everything returned equals ``tokenizer.text_ids(whole text)``.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        if not tokenizer.plain_added_tokens:
            raise TokenizerError(
                "incremental text needs added tokens matched on the raw text as they are "
                "(this tokenizer normalises or strips around some)"
            )
        self._tok = tokenizer
        self._added = tuple(sorted(tokenizer.added_tokens, key=len, reverse=True))
        self._pending = ""
        """Text not committed yet; it starts where everything restarts (module docstring)."""
        self._at_start = True
        """``_pending`` is the start of the text (it follows the role text in its segment)."""
        self._finished = False
        self.committed = 0
        """Tokens returned so far."""
        self.role_ids: list[int] | None = None
        """The role tokens in front of the text (:meth:`TextTokenizer.synthesis_ids`), known with
        the first committed piece: a text starting with a line break changes them."""

    @property
    def pending(self) -> str:
        """The text received but not committed yet."""
        return self._pending

    @property
    def finished(self) -> bool:
        return self._finished

    def push(self, delta: str) -> list[int]:
        """Add ``delta`` to the text; the tokens that can no longer change."""
        if self._finished:
            raise RuntimeError("text already finished")
        self._pending += delta
        return self._commit(self._final_length())

    def finish(self) -> list[int]:
        """End of the text: every remaining token."""
        if self._finished:
            raise RuntimeError("text already finished")
        self._finished = True
        return self._commit(len(self._pending))

    def _commit(self, length: int) -> list[int]:
        if length == 0:
            return []
        piece, self._pending = self._pending[:length], self._pending[length:]
        if self._at_start:
            ids = self._tok.synthesis_ids(piece)
            self.role_ids, ids = ids[:ROLE_TOKENS], ids[ROLE_TOKENS:-TAIL_TOKENS]
        else:
            ids = self._tok.encode(piece)
        self._at_start = False
        self.committed += len(ids)
        return ids

    # --- where the final part of the pending text ends ------------------------------------------
    def _final_length(self) -> int:
        """Length of the longest prefix of ``_pending`` whose tokens are final."""
        text = self._pending
        limit = self._partial_added_start(text)
        segment_start = 0
        i = 0
        while i < limit:  # complete added-token matches, leftmost-longest like the tokenizer
            token = self._added_at(text, i)
            if token is None:
                i += 1
            elif i + len(token) <= limit:
                i = segment_start = i + len(token)
            else:
                limit = i  # a match straddling the limit: keep it for later
        lead = ROLE_SEGMENT if self._at_start and segment_start == 0 else ""
        follow = text[limit] if limit < len(text) else None
        return segment_start + self._segment_final_length(text[segment_start:limit], lead, follow)

    def _added_at(self, text: str, i: int) -> str | None:
        for token in self._added:  # longest first
            if text.startswith(token, i):
                return token
        return None

    def _partial_added_start(self, text: str) -> int:
        """The earliest position from which ``text`` is a proper prefix of an added token (it may
        still become one), else ``len(text)``."""
        longest = max((len(t) for t in self._added), default=0)
        for p in range(max(0, len(text) - longest + 1), len(text)):
            tail = text[p:]
            if any(len(t) > len(tail) and t.startswith(tail) for t in self._added):
                return p
        return len(text)

    def _segment_final_length(self, segment: str, lead: str, follow: str | None) -> int:
        """Final raw length of ``segment`` (a segment's start, with ``lead`` before it in the same
        segment; ``follow`` = the held character after it, None at the end of the text)."""
        if not segment:
            return 0
        # Raw positions where normalisation is final (0: the segment starts where all restarts).
        stable = [0] + [i for i in range(1, len(segment)) if boundary_before(segment[i])]
        # The end is final when the held character cannot join the segment's text (it starts a
        # token that may still turn out to be plain text) or nothing can join its last one.
        if (follow is not None and boundary_before(follow)) or boundary_after(segment[-1]):
            stable.append(len(segment))
        if stable[-1] == 0:
            return 0
        # The final normalised prefix, and which of its offsets are raw stable positions.
        parts = [lead]
        raw_at = {len(lead): 0}
        offset = len(lead)
        for a, b in zip(stable, stable[1:]):
            chunk = segment[a:b]
            if not chunk.isascii():
                chunk = self._tok.normalize(chunk)
            parts.append(chunk)
            offset += len(chunk)
            raw_at[offset] = b
        normalized = "".join(parts)
        spans = self._tok.split(normalized)
        last_start = spans[-1][0]
        best = 0
        for start, _ in spans:
            if start > last_start:
                break
            if start > 0 and start in raw_at and not is_split_space(normalized[start - 1]):
                best = max(best, raw_at[start])
        return best


__all__ = ["IncrementalTokenizer"]
