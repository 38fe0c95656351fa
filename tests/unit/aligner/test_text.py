"""The aligner's units: the official word lists (recorded fixtures and, where the official
environment exists, hypothesis against it live) and code-point spans back into the text."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aligner_service.text import split_units
from aligner_service.text.japanese import normalised_with_spans
from aligner_service.text.korean import DICTIONARY, split_l_r
from aligner_service.text.units import is_kept_char

from .conftest import ROOT, load_cases

META, TEXT_CASES = load_cases("text_cases.json")
LANGUAGES = sorted({case["language"] for case in TEXT_CASES})


def test_fixtures_cover_the_languages_the_issue_names() -> None:
    assert {"english", "chinese", "japanese", "korean", "german", "french"} <= set(LANGUAGES)
    assert any("3.5-hour" in case["text"] for case in TEXT_CASES)


@pytest.mark.parametrize("case", TEXT_CASES, ids=lambda c: f"{c['language']}:{c['text'][:24]!r}")
def test_words_equal_the_official_split(case: dict) -> None:
    units = split_units(case["text"], case["language"])
    assert [u.text for u in units] == case["words"]
    check_spans(case["text"], case["language"], units)


def check_spans(text: str, language: str, units: list) -> None:
    """Spans are inside the text, in order, and hold the unit: outside Japanese the kept
    characters of the span ARE the unit; in Japanese (nagisa reads NFKC) they are after NFKC."""
    previous_end = 0
    previous_start = 0
    for unit in units:
        assert 0 <= unit.char_start < unit.char_end <= len(text), unit
        assert unit.char_start >= previous_start and unit.char_end >= previous_end, unit
        span = text[unit.char_start : unit.char_end]
        if language.lower() == "japanese":
            normalised = unicodedata.normalize("NFKC", span).replace("İ", "I")
            assert unit.text in "".join(ch for ch in normalised if is_kept_char(ch)), (unit, span)
        else:
            assert "".join(ch for ch in span if is_kept_char(ch)) == unit.text, (unit, span)
            assert is_kept_char(span[0]) and is_kept_char(span[-1]), (unit, span)
            previous_end = unit.char_end  # spans never overlap outside Japanese
        previous_start = unit.char_start


def test_korean_dictionary_is_the_official_one() -> None:
    shipped = (ROOT / "aligner_service" / "text" / "assets" / DICTIONARY).read_bytes()
    assert hashlib.sha256(shipped).hexdigest() == META["korean_dict_sha256"]


def test_korean_l_r_split_takes_the_longest_dictionary_prefix() -> None:
    words = frozenset({"대회", "대회장", "서울"})
    assert split_l_r("대회장에", words) == ("대회장", "에")
    assert split_l_r("서울입니다", words) == ("서울", "입니다")
    assert split_l_r("없는말", words) == ("없는말", "")  # no prefix scores: the whole piece
    assert split_l_r("대회", words) == ("대회", "")  # two characters stay whole


def test_character_mode_gives_every_letter_and_digit() -> None:
    text = "It's 3.5 中文!"
    units = split_units(text, "english", mode="character")
    assert [u.text for u in units] == ["I", "t", "s", "3", "5", "中", "文"]
    assert all(text[u.char_start : u.char_end] == u.text for u in units)


def test_a_request_s_language_is_read_here_as_it_comes() -> None:
    """The one rule callers rely on (they pass a request's language as is): case and surrounding
    spaces do not matter, and "auto" (no language) is "" (the whitespace split)."""
    japanese = "私は東京に住んでいます。"
    korean = "나는 서울에서 살아요"
    for text, language in ((japanese, "japanese"), (korean, "korean")):
        expected = split_units(text, language)
        assert expected != split_units(text, "")  # the language's own segmenter
        for spelling in (language.title(), language.upper(), f" {language} ", f"{language.title()}\n"):
            assert split_units(text, spelling) == expected, spelling
    for text in (japanese, "Hello there, it's 3 o'clock"):
        assert split_units(text, "auto") == split_units(text, " Auto ") == split_units(text, "")


def test_no_letters_or_digits_gives_no_units() -> None:
    for language in ("english", "chinese", "japanese", "korean"):
        assert split_units("  ... !? — ", language) == []
        assert split_units("", language, mode="character") == []


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unit mode"):
        split_units("a", "english", mode="syllable")  # type: ignore[arg-type]


def test_japanese_normalised_copy_maps_back() -> None:
    normalised, spans = normalised_with_spans("ｶﾞ① a")
    assert normalised == "ガ1\u3000a"  # NFKC composes the half-width pair; spaces as nagisa sees them
    assert spans == [(0, 2), (2, 3), (3, 4), (4, 5)]


# Text drawn from every script the official rules treat differently.
MIXED = st.text(
    alphabet=st.sampled_from(
        list("abcXYZ019 \t\n.,'-!?()「」、。　ｶﾞﾊﾟ①²é\u0301ßœİ")
        + list("今天气很好的人我中文日本語")
        + list("あいかきさアイカキサンー")
        + list("안녕하세요대회장서울입니다한국")
    ),
    max_size=30,
)


@given(text=MIXED, language=st.sampled_from(["english", "chinese", "japanese", "korean", "german", ""]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_words_equal_the_official_split_live(official_oracle, text: str, language: str) -> None:
    units = split_units(text, language)
    assert [u.text for u in units] == official_oracle.words(text, language)
    check_spans(text, language, units)


@given(text=MIXED, language=st.sampled_from(["english", "japanese", "korean"]))
@settings(max_examples=100, deadline=None)
def test_spans_hold_their_units(text: str, language: str) -> None:
    check_spans(text, language, split_units(text, language))
