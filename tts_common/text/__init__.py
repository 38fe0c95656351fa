"""Cutting text into sentences and into talker-sized segments (pure Python, no model needed).

Two uses share it: long-text synthesis cuts a chapter into consecutive talker requests
(``segment_text``), and streamed text input (an LLM's deltas) is cut into utterances at sentence
ends as soon as they are certain (``IncrementalSentenceSplitter``).

Sentence ends (``split_sentences``; the languages Qwen3-TTS serves: Chinese, English, Japanese,
Korean, German, French, Russian, Portuguese, Spanish, Italian):

1. A blank line always ends a sentence; so does a single line break, unless
   ``single_newline_is_boundary=False`` (hard-wrapped text, whose line breaks are mid-sentence).
2. The CJK marks 。！？；．｡ end a sentence wherever they stand (no spaces in CJK text), except a
   ． between letters or digits (full-width ３．１４).
3. The Western marks . ! ? … and runs of them (?!, ..., !!!) end a sentence before the end of the
   text, directly before a Han, kana or Hangul character, or before whitespace followed by a
   character that is not a lowercase letter ("Wait... what?" and '"Go!" he said' go on).
   Directly before anything else they are inside a token, never an end: 3.14, 1,000.5, v2.0,
   U.S., e.g., www.example.com, a.b@example.org, report.final.pdf, http://x.org/?q=1. (12:30
   and 1,000 have no end mark; they matter for clause cuts, below.)
4. A single "." before whitespace does not end the sentence after: a title or similar
   abbreviation (``NEVER_SENTENCE_END``: Mr. Dr. St. vs. e.g. i.e. z.B. Mme. Sra. Dott. т.е. ...),
   a number abbreviation before a number (No. 5, p. 12, Nr. 3), a single capital (initials:
   J. R. R. Tolkien, А. С. Пушкин), a one- or two-digit number (ordinals: am 3. Oktober).
   Abbreviations that often end a sentence (etc., U.S., Inc.) follow rule 3: "etc. and" goes on,
   "etc. Then" ends.
5. Closing quotes and brackets right after the end marks belong to the sentence: 'He said "Go."
   Then' ends after the quote; likewise ” ’ 」 』 ) ）. (“ ‘ « close a quotation after a Western
   mark, as in German „Geh.“, but open one after a CJK mark, as in 他走了。“你好”.)
6. Offsets: a sentence's ``start``/``end`` are character offsets into the text, tight around it
   (whitespace between sentences belongs to none), and ``text == original[start:end]``.

Misses are cheap by design: a missed end only makes a sentence longer (segment packing still
cuts it at clause marks when it is too long), while a false end can put a prosody break
mid-sentence. Known misses: "Main St. Then" (St. is taken as a title), "Plan B. Then" (an
initial), "I counted to 10. Then" (an ordinal); known false ends: "the U.S. Army" and Japanese
「行く。」と言った (a quotation inside a sentence).

Segments (``segment_text``): sentences packed greedily, in order, into segments of at most
``max_tokens`` text tokens as the caller's ``count_tokens`` counts them (the checkpoint's
tokenizer; ``estimate_tokens`` is a conservative stand-in). A sentence too long alone is cut at
clause marks (, ; : — and ，、；： — Western ones only before a space, so 1,000 and 12:30 stay
whole), a clause too long alone at spaces, and Han/kana text between characters; never inside a
word: a single word over the limit raises ``WordTooLongError``. Text without a letter or digit
raises ``NothingToSpeakError``. Both are ``InvalidRequestError``s (INVALID_ARGUMENT).

Choosing ``max_tokens`` is the caller's trade-off. Bigger segments mean fewer prosody breaks
(each segment is a separate utterance: intonation resets and a pause falls at every cut) and
fewer requests. Smaller ones mean lower latency to the first audio of each segment, less work
lost when one fails, and less risk of a long utterance running away (the talker drifting,
repeating, or running into its frame limit: its audio must fit ``max_new_tokens`` frames at 12.5
frames a second, in a KV slot shared with the prompt). A few sentences per segment (on the order
of 100-200 text tokens) keeps prosody natural while staying far from those limits.

Streamed text: push each delta into an ``IncrementalSentenceSplitter``; each sentence it returns
is final (equal to what ``split_sentences`` of the whole text gives). Skip the ones without
``has_speakable_text``, and fit the others with ``segment_text(sentence.text, max_tokens, count)``
(offsets relative to the sentence: ``piece.shifted(sentence.start)``). ``split_sentences`` of a
sentence's own text is that sentence, so a sentence that fits stays whole and one that does not
is cut as ``segment_text`` cuts it inside a whole text; only the joining of short sentences is
left out (joining would wait for the next sentence: the caller decides what latency buys).
"""

from __future__ import annotations

from tts_common.text.estimate import estimate_tokens
from tts_common.text.packing import (
    NothingToSpeakError,
    TokenCounter,
    WordTooLongError,
    has_speakable_text,
    segment_text,
)
from tts_common.text.sentences import (
    NEVER_SENTENCE_END,
    NOT_END_BEFORE_NUMBER,
    IncrementalSentenceSplitter,
    Segment,
    split_sentences,
)

__all__ = [
    "NEVER_SENTENCE_END",
    "NOT_END_BEFORE_NUMBER",
    "IncrementalSentenceSplitter",
    "NothingToSpeakError",
    "Segment",
    "TokenCounter",
    "WordTooLongError",
    "estimate_tokens",
    "has_speakable_text",
    "segment_text",
    "split_sentences",
]
