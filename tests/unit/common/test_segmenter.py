"""tts_common.text: sentence ends, segment packing, the token estimate, the incremental splitter."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tts_common.errors import InvalidRequestError
from tts_common.text import (
    IncrementalSentenceSplitter,
    NothingToSpeakError,
    Segment,
    WordTooLongError,
    estimate_tokens,
    has_speakable_text,
    segment_text,
    split_sentences,
)

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLOSERS = "\"')]}»«›‹”“’‘」』）］｝】》〉〕〗〙〛"
HAN_KANA = r"[\u3040-\u30ff\u4e00-\u9fff]"


def sentences(text: str, **kw: bool) -> list[str]:
    return [s.text for s in split_sentences(text, **kw)]


def word_count(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------------------- text strategies

# Fragments that exercise the rules: end marks and their runs, closers, abbreviations, numbers,
# URLs, CJK, line breaks; glued together with or without spaces.
FRAGMENTS = [
    "Hello", "world", "Then", "then", "it", "Dr.", "Mr.", "e.g.", "etc.", "U.S.", "No.", "5",
    "3.14", "1,000.5", "12:30", "v2.0", "J.", "R.", "x=1.", "www.example.com", "a.b@c.de",
    "notes.final.txt", "http://x.org/?q=1", ".", "..", "...", "…", "!", "?", "?!", ",", ";", ":",
    "—", "-", "–", '"', "'", ")", "”", "“", "’", "」", "「", "』", "）", "«", "»", "。", "！", "？",
    "；", "．", "，", "、", "：", "你好", "世界", "カタカナ", "ひらがな", "한국어", "Привет", "мир",
    "Straße", "ça", "３", "３．１４", "ｖ２．０", "\n", "\n\n", "\r\n", "\r", " \n ", "\t", "*", "A",
    "b", "7", "10.", "zz", "z.B.", "Mme", "\u00a0", "\u202f!", "(", "pneumonoultramicroscopic",
]  # fmt: skip
SEPARATORS = ["", " ", " ", "  ", "\n"]


@st.composite
def texts(draw: st.DrawFn, max_parts: int = 30) -> str:
    parts = draw(
        st.lists(
            st.one_of(
                st.sampled_from(FRAGMENTS),
                st.text(alphabet=st.sampled_from(".!?… \n。」A a1,"), max_size=4),
            ),
            max_size=max_parts,
        )
    )
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps))


@st.composite
def text_and_cuts(draw: st.DrawFn) -> tuple[str, list[int]]:
    text = draw(texts())
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return text, cuts


def assert_tiles(text: str, segments: list[Segment]) -> None:
    """Each segment is text[start:end], stripped and non-empty; only whitespace lies outside."""
    pos = 0
    for seg in segments:
        assert seg.text == text[seg.start : seg.end]
        assert seg.text and seg.text == seg.text.strip()
        assert seg.start >= pos and text[pos : seg.start].strip() == ""
        pos = seg.end
    assert text[pos:].strip() == ""
    # Hence joining the segments gives the text back, whitespace aside.
    assert re.sub(r"\s", "", "".join(s.text for s in segments)) == re.sub(r"\s", "", text)


# ---------------------------------------------------------------------------- sentence ends


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Hello world. How are you? I'm fine!", ["Hello world.", "How are you?", "I'm fine!"]),
        ("What?! No way!!! Yes.", ["What?!", "No way!!!", "Yes."]),
        ("Wait... Then it left.", ["Wait...", "Then it left."]),
        ("Wait... what was that?", ["Wait... what was that?"]),
        ("Well… Maybe. Hm… no.", ["Well…", "Maybe.", "Hm… no."]),
        ('He said "Go." Then he left.', ['He said "Go."', "Then he left."]),
        ("“Go!” he said. Then nothing.", ["“Go!” he said.", "Then nothing."]),
        ("(It rained.) Then it stopped.", ["(It rained.)", "Then it stopped."]),
        ("She said ‘no.’ Then ‘yes.’", ["She said ‘no.’", "Then ‘yes.’"]),
        ('"Really?" "Yes."', ['"Really?"', '"Yes."']),
        ("no final mark", ["no final mark"]),
        ("  padded.  ", ["padded."]),
    ],
)
def test_english_sentence_ends(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Pi is 3.14 and the price is 1,000.5 dollars at 12:30 in version v2.0 today.",
        "Dr. Smith met Mr. Jones, Mrs. Brown, Ms. White and St. John vs. the rest.",
        "We use fruit, e.g. apples, i.e. round ones, etc. and more.",
        "Call the U.S. embassy about item No. 5 in room No. 12 today.",
        "The Lord of the Rings is by J. R. R. Tolkien and Pushkin is А. С. Пушкин here.",
        "Visit https://www.example.com/a/b.html?x=1&y=2 or mail john.doe@example.co.uk now.",
        "Open notes.final.txt and config.v2.yaml first.",
        "Wir treffen uns am 3. Oktober im 19. Jahrhundert, z.B. mit Hrn. Meier.",
        "Le Dr. Martin et Mme. Dupont, p.ex. demain.",
        "La Sra. García y el Sr. López, aprox. a las 5.",
        "Il Sig. Rossi e la Dott.ssa Bianchi arrivano.",
        "Это т.е. пример, проф. Иванов.",
        "Versão 2.0 custa 3,50 euros.",
    ],
)
def test_no_end_inside_numbers_abbreviations_urls(text: str) -> None:
    assert sentences(text) == [text]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("It costs 5 dollars, etc. Then we go.", ["It costs 5 dollars, etc.", "Then we go."]),
        ("They moved to the U.S. It was cold.", ["They moved to the U.S.", "It was cold."]),
        (
            "Visit www.example.com. Then mail a@b.org. Done.",
            ["Visit www.example.com.", "Then mail a@b.org.", "Done."],
        ),
        ("Born in 1990. Then raised.", ["Born in 1990.", "Then raised."]),
        ("He said No. Then he left.", ["He said No.", "Then he left."]),
        ("Set x=1. Then go.", ["Set x=1.", "Then go."]),
    ],
)
def test_ends_after_abbreviation_like_words(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("你好。我很好！你呢？", ["你好。", "我很好！", "你呢？"]),
        ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
        ("他走了。“你好，”她说。", ["他走了。", "“你好，”她说。"]),
        ("第一；第二。", ["第一；", "第二。"]),
        ("圆周率是3.14，版本v2.0发布了。好的", ["圆周率是3.14，版本v2.0发布了。", "好的"]),
        ("全角３．１４です．次です．", ["全角３．１４です．", "次です．"]),
        ("「行こう。」『はい！』今日は晴れ。", ["「行こう。」", "『はい！』", "今日は晴れ。"]),
        ("これはペンです。あれは本です", ["これはペンです。", "あれは本です"]),
        ("안녕하세요. 반갑습니다! 네?", ["안녕하세요.", "반갑습니다!", "네?"]),
        ("I like it.我也喜欢!真的?Yes.", ["I like it.", "我也喜欢!", "真的?", "Yes."]),
        ("Hello 世界。Next one. 再见", ["Hello 世界。", "Next one.", "再见"]),
        ("¿Qué pasa? ¡Nada! Bien.", ["¿Qué pasa?", "¡Nada!", "Bien."]),
        ("Привет. Как дела? Хорошо.", ["Привет.", "Как дела?", "Хорошо."]),
        ("Er sagte: „Geh.“ Dann ging er.", ["Er sagte: „Geh.“", "Dann ging er."]),
        (
            "Il a dit «\u00a0Non\u202f!\u00a0» Puis il est parti.",
            ["Il a dit «\u00a0Non\u202f!\u00a0»", "Puis il est parti."],
        ),
    ],
)
def test_cjk_and_other_languages(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


def test_line_and_paragraph_breaks() -> None:
    text = "Chapter 1\n\nIt was a dark night\nand cold.\r\nThe end"
    assert sentences(text) == ["Chapter 1", "It was a dark night", "and cold.", "The end"]
    # Hard-wrapped text: single line breaks are spaces, blank lines (also "\r\n \r\n") still end.
    wrapped = "Chapter 1\n\nIt was a dark\nnight and cold.\r\n \r\nThe end\nof it"
    assert sentences(wrapped, single_newline_is_boundary=False) == [
        "Chapter 1",
        "It was a dark\nnight and cold.",
        "The end\nof it",
    ]
    # A line break ends a sentence even after an abbreviation.
    assert sentences("Ask Dr.\nSmith") == ["Ask Dr.", "Smith"]


def test_sentence_offsets() -> None:
    text = '  He said "Go."  Then\n\n你好。ok '
    got = split_sentences(text)
    assert got == [
        Segment(2, 15, 'He said "Go."'),
        Segment(17, 21, "Then"),
        Segment(23, 26, "你好。"),
        Segment(26, 28, "ok"),
    ]
    assert split_sentences("") == [] and split_sentences(" \n\t ") == []


@PROPERTY
@given(texts(), st.booleans())
def test_sentences_tile_the_text(text: str, single_newline: bool) -> None:
    got = split_sentences(text, single_newline_is_boundary=single_newline)
    assert_tiles(text, got)
    # Each end but the last is an end mark (closers aside) or a hard line break.
    for seg, nxt in zip(got, got[1:]):
        gap = text[seg.end : nxt.start].replace("\r\n", "\n")
        breaks = sum(gap.count(c) for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
        hard = breaks >= (1 if single_newline else 2)
        assert hard or seg.text.rstrip(CLOSERS)[-1:] in ".!?…‼⁇⁈⁉。！？；．｡", (seg, nxt)


@PROPERTY
@given(texts(), st.booleans())
def test_sentence_alone_is_one_sentence(text: str, single_newline: bool) -> None:
    """The decisions inside a sentence do not depend on the text around it."""
    for seg in split_sentences(text, single_newline_is_boundary=single_newline):
        alone = split_sentences(seg.text, single_newline_is_boundary=single_newline)
        assert alone == [Segment(0, len(seg.text), seg.text)]


PROTECTED = [
    "3.14", "1,000.5", "12:30", "v2.0", "www.example.com/a?b=1", "a.b@example.org",
    "report.final.pdf", "Dr. Smith", "Mr. Jones", "Mrs. Brown", "Ms. White", "St. Louis",
    "e.g. Paris", "i.e. Rome", "J. R. R. Tolkien", "No. 5", "vs. Them", "U.S. embassy",
    "etc. and", "Wait... what",
]  # fmt: skip


@PROPERTY
@given(st.lists(st.sampled_from(PROTECTED + ["Then.", "go!", "No?", "你好。", "\n\n", "Hi"]), max_size=12))
def test_no_end_inside_protected_tokens(parts: list[str]) -> None:
    text, spans = "", []
    for part in parts:
        if part in PROTECTED:
            spans.append((len(text), len(text) + len(part)))
        text += part + " "
    ends = {s.end for s in split_sentences(text)}
    for start, end in spans:
        assert not any(start < e < end for e in ends), (text, text[start:end])


# ---------------------------------------------------------------------------- incremental


@PROPERTY
@given(text_and_cuts(), st.booleans())
def test_incremental_equals_one_shot(case: tuple[str, list[int]], single_newline: bool) -> None:
    text, cuts = case
    splitter = IncrementalSentenceSplitter(single_newline_is_boundary=single_newline)
    got: list[Segment] = []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        got += splitter.push(text[a:b])
    got += splitter.finish()
    assert got == split_sentences(text, single_newline_is_boundary=single_newline)


@PROPERTY
@given(texts())
def test_incremental_char_by_char_emits_each_sentence_once_known(text: str) -> None:
    """Fed one character at a time, a sentence comes out no later than one whitespace run plus
    one character after its end (the look-ahead the rules need), and never before its end."""
    splitter = IncrementalSentenceSplitter()
    got: list[Segment] = []
    for i, ch in enumerate(text):
        for seg in splitter.push(ch):
            rest = text[seg.end : i + 1]
            assert rest and rest[:-1].strip() == "", (seg, rest)
            got.append(seg)
    got += splitter.finish()
    assert got == split_sentences(text)


def test_incremental_holds_undecided_ends() -> None:
    splitter = IncrementalSentenceSplitter()
    assert splitter.push("I met Dr.") == []
    assert splitter.push(" ") == []  # undecided until the next word
    assert splitter.push("Smith. It") == [Segment(0, 16, "I met Dr. Smith.")]
    assert splitter.push(" was 3.") == []  # a decimal may follow
    assert splitter.push("5 today.") == []
    assert splitter.push(" so") == []  # lowercase: the sentence goes on
    assert splitter.push(" it is。") == []  # a closing quote may follow
    assert splitter.push("ok") == [Segment(17, 44, "It was 3.5 today. so it is。")]
    assert splitter.push("\n") == [Segment(44, 46, "ok")]
    assert splitter.finish() == []
    assert splitter.finish() == []
    with pytest.raises(RuntimeError):
        splitter.push("more")


def test_incremental_offsets_continue_across_whitespace() -> None:
    splitter = IncrementalSentenceSplitter()
    assert splitter.push("  One.   ") == []
    assert splitter.push("   Two. ") == [Segment(2, 6, "One.")]
    assert splitter.finish() == [Segment(12, 16, "Two.")]


# ---------------------------------------------------------------------------- segments


def test_short_sentences_are_joined() -> None:
    text = "One two. Three four. Five six. Seven eight."
    got = segment_text(text, 4, word_count)
    assert [s.text for s in got] == ["One two. Three four.", "Five six. Seven eight."]
    assert [s.text for s in segment_text(text, 100, word_count)] == [text]
    assert [s.text for s in segment_text(text, 5, word_count)] == [
        "One two. Three four.",
        "Five six. Seven eight.",
    ]


def test_sentence_boundaries_preferred_over_clauses() -> None:
    text = "Short one. A longer sentence, with a clause, goes here. End."
    got = [s.text for s in segment_text(text, 6, word_count)]
    # The long sentence (8 words) does not join "Short one." and is cut at its commas; its last
    # piece takes the next sentence along.
    assert got == ["Short one.", "A longer sentence, with a clause,", "goes here. End."]


def test_long_sentence_cut_at_clause_marks_then_words() -> None:
    text = "alpha beta gamma delta, epsilon zeta; eta theta iota kappa lambda mu: nu — xi omicron"
    got = [s.text for s in segment_text(text, 3, word_count)]
    # The last piece of a cut clause stays open for the next clause ("delta, epsilon zeta;").
    assert got == [
        "alpha beta gamma",
        "delta, epsilon zeta;",
        "eta theta iota",
        "kappa lambda mu:",
        "nu —",
        "xi omicron",
    ]


def test_clause_marks_inside_numbers_do_not_cut() -> None:
    text = "It is 12:30 and costs 1,000.5 or 2,5 in total, right"
    got = [s.text for s in segment_text(text, 5, word_count)]
    assert got == ["It is 12:30 and costs", "1,000.5 or 2,5 in total,", "right"]


def test_cjk_cut_at_clause_marks_then_between_characters() -> None:
    text = "今天天气很好，我们去公园散步吧。"
    got = [s.text for s in segment_text(text, 9, estimate_tokens)]
    assert got == ["今天天气很好，", "我们去公园散步吧。"]
    got = [s.text for s in segment_text("我们去公园散步吧。", 3, estimate_tokens)]
    assert got == ["我们去", "公园散", "步吧。"]  # the end mark stays with its character
    # Kinsoku: no piece starts with a small kana or the long-vowel mark; Latin words stay whole.
    got = [s.text for s in segment_text("コーヒーとGPT4を", 2, estimate_tokens)]
    assert got == ["コー", "ヒー", "と", "GPT4", "を"]


def test_unspeakable_units_are_glued() -> None:
    text = "First part.\n\n* * *\n\nSecond part."
    got = [s.text for s in segment_text(text, 5, word_count)]
    assert got == ["First part.\n\n* * *", "Second part."]
    assert [s.text for s in segment_text("… Hello there.", 3, word_count)] == ["… Hello there."]
    assert [s.text for s in segment_text("… Hello there.", 2, word_count)] == ["… Hello", "there."]
    # A word with its punctuation glued on is the smallest unit: over the limit, it is an error.
    with pytest.raises(WordTooLongError) as info:
        segment_text(text, 2, word_count)
    assert info.value.word == "part.\n\n* * *" and info.value.tokens == 4


def test_segment_offsets() -> None:
    text = " A b. C d.\n\nE f. "
    assert segment_text(text, 2, word_count) == [
        Segment(1, 5, "A b."),
        Segment(6, 10, "C d."),
        Segment(12, 16, "E f."),
    ]


def glued_units(sents: list[Segment]) -> list[tuple[int, int]]:
    """Sentence spans with the punctuation-only ones glued to the one before (or after)."""
    units: list[tuple[int, int]] = []
    lead = None
    for s in sents:
        if has_speakable_text(s.text):
            units.append((s.start if lead is None else lead, s.end))
            lead = None
        elif units:
            units[-1] = (units[-1][0], s.end)
        elif lead is None:
            lead = s.start
    return units


def assert_is_one_word(err: WordTooLongError, count: Callable[[str], int]) -> None:
    """The error names a real word: one run with speakable text (punctuation-only runs glued on),
    in the text, over the limit on its own."""
    assert sum(has_speakable_text(w) for w in err.word.split()) == 1, err.word
    assert err.tokens == count(err.word) > err.limit


@PROPERTY
@given(texts(), st.integers(1, 6), st.booleans())
def test_segments_fit_and_tile_word_counter(text: str, target: int, single_newline: bool) -> None:
    if not has_speakable_text(text):
        with pytest.raises(NothingToSpeakError):
            segment_text(text, target, word_count)
        return
    try:
        got = segment_text(text, target, word_count, single_newline_is_boundary=single_newline)
    except WordTooLongError as err:
        assert err.word in text and err.limit == target
        assert_is_one_word(err, word_count)
        return
    assert_tiles(text, got)
    assert all(word_count(s.text) <= target for s in got)
    assert all(has_speakable_text(s.text) for s in got)
    units = glued_units(split_sentences(text, single_newline_is_boundary=single_newline))
    unit_at = dict(units)
    for prev, seg in zip(got, got[1:]):
        if seg.start in unit_at:
            # Greedy: the next sentence (with the punctuation-only ones glued to it) did not fit.
            assert word_count(text[prev.start : unit_at[seg.start]]) > target
        else:
            # Cut inside a sentence: only one that does not fit alone, and only between words.
            start, end = next(u for u in units if u[0] < seg.start < u[1])
            assert word_count(text[start:end]) > target
            around = text[seg.start - 1 : seg.start + 1]
            after_mark = text[: seg.start].rstrip(CLOSERS)[-1:] in "，、；：､—―"
            assert around[0].isspace() or after_mark or re.search(HAN_KANA, around), around


@PROPERTY
@given(texts(), st.integers(1, 40))
def test_segments_fit_default_estimator(text: str, target: int) -> None:
    if not has_speakable_text(text):
        return
    try:
        got = segment_text(text, target)
    except WordTooLongError as err:
        assert err.word in text and err.limit == target
        assert_is_one_word(err, estimate_tokens)
        return
    assert_tiles(text, got)
    assert all(estimate_tokens(s.text) <= target for s in got)


@PROPERTY
@given(texts(max_parts=15), st.integers(1, 30))
def test_streamed_sentences_fit_like_one_shot(text: str, target: int) -> None:
    """The streaming recipe: each complete sentence fitted alone gives segments that fit and
    tile the text."""
    pieces: list[Segment] = []
    splitter = IncrementalSentenceSplitter()
    try:
        for sent in splitter.push(text) + splitter.finish():
            if has_speakable_text(sent.text):
                pieces += [p.shifted(sent.start) for p in segment_text(sent.text, target)]
    except WordTooLongError:
        return
    assert all(p.text == text[p.start : p.end] and estimate_tokens(p.text) <= target for p in pieces)
    assert all(a.end <= b.start for a, b in zip(pieces, pieces[1:]))


# ---------------------------------------------------------------------------- errors


def test_word_too_long_error() -> None:
    word = "https://example.com/" + "x" * 80
    with pytest.raises(WordTooLongError) as info:
        segment_text(f"Open {word} now.", 10)
    err = info.value
    assert isinstance(err, InvalidRequestError) and err.grpc_status == "INVALID_ARGUMENT"
    assert err.word == word and err.limit == 10 and err.tokens == estimate_tokens(word)
    msg = str(err)
    assert word[:39] + "…" in msg and word not in msg  # truncated
    assert f"{err.tokens} text tokens" in msg and "limit of 10 tokens" in msg
    with pytest.raises(WordTooLongError, match="'extraordinary' is 4 text tokens.*limit of 3"):
        segment_text("An extraordinary day.", 3)


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "...!?", "— * —", "。」"])
def test_nothing_to_speak(text: str) -> None:
    assert not has_speakable_text(text)
    with pytest.raises(NothingToSpeakError, match="nothing to speak") as info:
        segment_text(text, 10)
    assert isinstance(info.value, InvalidRequestError)


def test_speakable_text() -> None:
    assert has_speakable_text("a") and has_speakable_text("。5") and has_speakable_text("你")
    assert has_speakable_text("Ж") and has_speakable_text("٣")


def test_bad_target() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        segment_text("Hello.", 0)


# ---------------------------------------------------------------------------- estimate


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", 0),
        ("   ", 0),
        ("你好世界", 4),
        ("カタカナ한국", 6),
        ("1234", 4),
        ("the", 1),
        ("hello", 2),
        ("extraordinary", 4),
        ("привет", 3),  # 12 UTF-8 bytes
        ("Straße", 2),  # 7 bytes
        ("Hi, you!", 4),  # 1 + 1 + 1 + 1
        ("a\n\nb", 3),  # a line-break run is one token
        ("a \n \n b", 4),
        ("GPT4是", 3),
    ],
)
def test_estimate_tokens(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


@PROPERTY
@given(st.text(max_size=30), st.text(max_size=30))
def test_estimate_grows_with_the_text(a: str, b: str) -> None:
    """Joining never costs less than the larger part: a segment's estimate grows as it does."""
    assert estimate_tokens(a + b) >= max(estimate_tokens(a), estimate_tokens(b))
