"""tts_common.flags: flags generated from config dataclasses (help from attribute docstrings,
defaults, annotation types, metadata exceptions) and the environment precedence."""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_common.flags import (
    NOT_A_FLAG,
    add_config_flags,
    attribute_docstrings,
    comma_list,
    config_flags,
    config_from_args,
    env_names,
    flag,
    parse_bool,
    positive_int,
)


@dataclass
class Base:
    """A base config."""

    count: int = 3
    """How many (``count``); see :func:`something.else` for 100 % details."""

    ratio: float = 0.5
    """A ratio."""


@dataclass
class Sample(Base):
    """Every kind of field."""

    ratio: float = 0.25
    """The subclass's ratio."""

    name: str = "x"
    """A name."""

    path: str | None = None
    """An optional path."""

    targets: tuple[str, ...] = ()
    """Addresses."""

    sizes: tuple[int, ...] = (1, 2)
    """Sizes."""

    keys: frozenset[str] = frozenset()
    """Keys."""

    verbose: bool = False
    """Talk more."""

    graphs: bool = field(default=True, metadata=flag(name="--no-graphs", negate=True))
    """Use graphs."""

    slots: int = field(default=4, metadata=flag(parse=positive_int))
    """Slots."""

    dtype: str = field(default="float32", metadata=flag(choices=("float32", "bfloat16")))
    """Dtype."""

    port: int = field(default=80, metadata=flag(stage_env_only=True))
    """Port."""

    legacy: int = field(default=7, metadata=flag(name="--old-name", env="OLDER"))
    """Renamed."""

    internal: list[int] = field(default_factory=list, metadata=NOT_A_FLAG)
    """Set by code."""


def parser_for(
    cls: type = Sample, env: dict[str, str] | None = None, stage: str = "st", **kw: object
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prog")
    add_config_flags(parser, cls, stage=stage, env=env or {}, **kw)  # type: ignore[arg-type]
    return parser


def parse(argv: list[str], env: dict[str, str] | None = None, cls: type = Sample, **kw: object) -> object:
    return config_from_args(cls, parser_for(cls, env, **kw).parse_args(argv))


def usage_error(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The usage error message of parsing ``argv`` in ``env`` (fails if it parses)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exc:
        parse(argv, env)
    assert exc.value.code == 2
    return stderr.getvalue()


def test_flags_follow_fields_and_metadata() -> None:
    flags = {f.field: f for f in config_flags(Sample)}
    assert list(flags) == [
        "count", "ratio", "name", "path", "targets", "sizes", "keys", "verbose", "graphs", "slots",
        "dtype", "port", "legacy",
    ]  # fmt: skip
    assert flags["count"].option == "--count" and flags["path"].option == "--path"
    assert flags["graphs"].option == "--no-graphs" and flags["graphs"].env_key == "NO_GRAPHS"
    assert flags["legacy"].option == "--old-name" and flags["legacy"].env_key == "OLDER"
    assert flags["port"].env_names("st") == ("QWEN3TTS_ST_PORT",)
    assert flags["count"].env_names("st") == ("QWEN3TTS_ST_COUNT", "QWEN3TTS_COUNT")
    assert flags["count"].env_names("") == ("QWEN3TTS_COUNT",)


def test_defaults_types_and_not_a_flag() -> None:
    config = parse([])
    assert config == Sample()
    config = parse(
        "--count 9 --ratio 2.5 --name n --path /p --targets a:1,b:2 --sizes 3,4 --keys k2,k1,k2 "
        "--verbose --no-graphs --slots 2 --dtype bfloat16 --port 0 --old-name 1".split()
    )
    assert config == Sample(
        count=9, ratio=2.5, name="n", path="/p", targets=("a:1", "b:2"), sizes=(3, 4),
        keys=frozenset({"k1", "k2"}), verbose=True, graphs=False, slots=2, dtype="bfloat16", port=0, legacy=1,
    )  # fmt: skip
    assert parse(["--path", ""]).path is None  # an empty optional value means None
    assert parse(["--targets", " , "]).targets == ()
    assert config_from_args(Sample, parser_for().parse_args([]), internal=[1]).internal == [1]
    with pytest.raises(TypeError, match="come from flags"):
        config_from_args(Sample, parser_for().parse_args([]), count=1)


def test_help_comes_from_attribute_docstrings() -> None:
    docs = attribute_docstrings(Sample)
    assert docs["ratio"] == "The subclass's ratio."  # the subclass wins
    assert docs["count"].startswith("How many (count); see something.else")  # inherited, markup removed
    text = parser_for(env={"QWEN3TTS_COUNT": "5"}).format_help()
    flat = " ".join(text.split())
    assert "How many (count); see something.else for 100 % details." in flat
    assert "(env QWEN3TTS_ST_COUNT / QWEN3TTS_COUNT; default 5)" in flat  # from the environment
    assert "(env QWEN3TTS_ST_RATIO / QWEN3TTS_RATIO; default 0.25)" in flat
    assert "(comma-separated; env QWEN3TTS_ST_SIZES / QWEN3TTS_SIZES; default 1,2)" in flat
    assert "Disable: Use graphs. (env QWEN3TTS_ST_NO_GRAPHS / QWEN3TTS_NO_GRAPHS; default off)" in flat
    assert "(env QWEN3TTS_ST_PORT; default 80)" in flat
    assert "--dtype {float32,bfloat16}" in flat
    assert "internal" not in flat


def test_environment_precedence() -> None:
    env = {"QWEN3TTS_ST_COUNT": "5", "QWEN3TTS_COUNT": "6", "QWEN3TTS_RATIO": "1.5", "QWEN3TTS_PORT": "1"}
    config = parse([], env)
    assert (config.count, config.ratio, config.port) == (5, 1.5, 80)  # ports: stage-specific only
    assert parse(["--count", "8"], env).count == 8  # the command line wins
    assert parse([], {"QWEN3TTS_ST_COUNT": "", "QWEN3TTS_COUNT": "6"}).count == 6  # empty = unset
    assert parse([], {"QWEN3TTS_ST_PORT": "81"}).port == 81
    assert parse([], {"QWEN3TTS_OLDER": "2"}).legacy == 2
    assert parse([], {"QWEN3TTS_ST_KEYS": "a, b"}).keys == {"a", "b"}
    assert parse([], {"QWEN3TTS_PATH": "/e"}).path == "/e"
    # Per-call defaults replace dataclass defaults, below the environment.
    assert parse([], {}, defaults={"count": 11}).count == 11
    assert parse([], {"QWEN3TTS_COUNT": "6"}, defaults={"count": 11}).count == 6
    with pytest.raises(TypeError, match="not flags"):
        parser_for(defaults={"internal": []})


def test_malformed_values_are_usage_errors() -> None:
    assert "argument --count: invalid int value: 'x'" in usage_error(["--count", "x"])
    message = usage_error([], {"QWEN3TTS_COUNT": "x"})
    assert "argument --count: invalid int value: 'x' (from QWEN3TTS_COUNT)" in message
    assert "must be > 0" in usage_error(["--slots", "0"])
    assert "QWEN3TTS_ST_SLOTS" in usage_error([], {"QWEN3TTS_ST_SLOTS": "-1"})
    assert "invalid choice" in usage_error(["--dtype", "float16"])
    assert "QWEN3TTS_DTYPE" in usage_error([], {"QWEN3TTS_DTYPE": "float16"})
    assert "QWEN3TTS_SIZES" in usage_error([], {"QWEN3TTS_SIZES": "1,two"})
    assert "invalid boolean" in usage_error([], {"QWEN3TTS_NO_GRAPHS": "maybe"})
    # A malformed variable is never read when the flag is given.
    assert parse(["--count", "2"], {"QWEN3TTS_COUNT": "x"}).count == 2
    assert parse(["--no-graphs"], {"QWEN3TTS_NO_GRAPHS": "maybe"}).graphs is False


@pytest.mark.parametrize(("text", "graphs", "verbose"), [("1", False, True), ("true", False, True),
                         ("ON", False, True), ("0", True, False), ("no", True, False)])  # fmt: skip
def test_switches_from_the_environment(text: str, graphs: bool, verbose: bool) -> None:
    config = parse([], {"QWEN3TTS_NO_GRAPHS": text, "QWEN3TTS_VERBOSE": text})
    assert (config.graphs, config.verbose) == (graphs, verbose)
    assert parse(["--no-graphs", "--verbose"], {"QWEN3TTS_NO_GRAPHS": text}).graphs is False


def test_fields_without_a_derivable_flag_are_refused() -> None:
    @dataclass
    class NoDoc:
        count: int = 1

    @dataclass
    class Unsupported:
        table: dict[str, int] = field(default_factory=dict)
        """A mapping."""

    @dataclass
    class BadSwitch:
        on: bool = field(default=False, metadata=flag(negate=True))
        """A negated switch must default to True."""

    @dataclass
    class BadNegate:
        count: int = field(default=1, metadata=flag(negate=True))
        """Not a bool."""

    for cls, match in ((NoDoc, "docstring"), (Unsupported, "no flag parser"), (BadSwitch, "default True"),
                       (BadNegate, "needs a bool")):  # fmt: skip
        with pytest.raises(TypeError, match=match):
            config_flags(cls)


def test_env_names() -> None:
    assert env_names("talker", "max_slots") == ("QWEN3TTS_TALKER_MAX_SLOTS", "QWEN3TTS_MAX_SLOTS")
    assert env_names("talker", "PORT", stage_only=True) == ("QWEN3TTS_TALKER_PORT",)
    assert env_names("", "PORT", stage_only=True) == ("QWEN3TTS_PORT",)


# ---------------------------------------------------------------------------------------------
# Properties

_item = st.text(alphabet=st.characters(blacklist_characters=",", blacklist_categories=("Cs",)), max_size=8)


@given(st.lists(_item, max_size=6))
def test_comma_list_strips_and_drops_blanks(items: list[str]) -> None:
    assert comma_list(",".join(items)) == tuple(i.strip() for i in items if i.strip())


@given(st.lists(st.text(alphabet="abc:1 ", max_size=6), max_size=5))
def test_tuple_and_frozenset_flags_agree_with_comma_list(items: list[str]) -> None:
    text = ",".join(items)
    config = parse(["--targets", text, "--keys", text])
    assert config.targets == comma_list(text) and config.keys == frozenset(comma_list(text))


_values = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.sampled_from(
        ["x", "1.5", " 7", "0", "-0", "1e3", "nan", "inf", "float32", "bfloat16", "true", "0x10"]
    ),
)


@given(st.sampled_from(["count", "ratio", "slots", "dtype", "sizes", "path"]), _values)
def test_environment_values_parse_exactly_like_flag_values(name: str, text: str) -> None:
    """The same text gives the same value (or both a usage error) on the command line, in the
    stage variable and in the generic variable."""
    option = "--" + name

    def outcome(argv: list[str], env: dict[str, str]) -> object:
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                return repr(getattr(parse(argv, env), name))  # repr: nan == nan
            except SystemExit as exc:
                return ("usage error", exc.code)

    from_flag = outcome([f"{option}={text}"], {})
    assert outcome([], {f"QWEN3TTS_ST_{name.upper()}": text}) == from_flag
    assert outcome([], {f"QWEN3TTS_{name.upper()}": text}) == from_flag


@given(st.text(max_size=8))
def test_parse_bool_accepts_exactly_the_documented_words(text: str) -> None:
    word = text.strip().lower()
    if word in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        assert parse_bool(text) is (word in {"1", "true", "yes", "on"})
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bool(text)
