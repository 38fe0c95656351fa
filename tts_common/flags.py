"""Command-line flags generated from typed config dataclasses.

A process's settings are dataclasses whose fields carry attribute docstrings::

    @dataclass
    class DecoderConfig:
        max_streams: int = 64
        \"\"\"Concurrent Decode streams; more -> RESOURCE_EXHAUSTED.\"\"\"

:func:`add_config_flags` adds one flag per field (``--max-streams``) and :func:`config_from_args`
builds the dataclass back from the parsed namespace, so each setting is written once:

* **help** is the field's attribute docstring, read with :mod:`ast` from the class source (base
  classes included); a flag without one is a programming error;
* **default** is the dataclass default (or ``default_factory()``), unless the environment sets it;
* **type** follows the annotation: ``int``, ``float``, ``str``, ``bool`` (a switch taking no
  value), ``T | None`` (an empty value means None), ``tuple[T, ...]`` and ``frozenset[T]``
  (comma-separated; blanks around items and empty items are dropped);
* **exceptions** are field metadata, :func:`flag` (another flag name, a negated switch such as
  ``--no-silence-stop``, a validating parser, choices, another environment name, a stage-only
  environment variable) or :data:`NOT_A_FLAG`.

Environment: the default of a flag comes from ``QWEN3TTS_<STAGE>_<KEY>``, then ``QWEN3TTS_<KEY>``
(only the first for stage-only flags such as ports: one ``QWEN3TTS_PORT`` shared by every process
on a host would make them collide), then the dataclass default. ``KEY`` is the flag name in upper
case with underscores (``--max-slots`` -> ``MAX_SLOTS``). An empty variable counts as unset.
Values are parsed exactly like the flag's command-line value (a switch reads ``1/true/yes/on`` or
``0/false/no/off``); a malformed one is a usage error naming the variable, unless the flag itself is
given: command-line flags win.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

ENV_PREFIX = "QWEN3TTS_"
"""Prefix of the environment variables that provide flag defaults."""

_METADATA_KEY = "qwen3tts.flag"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

_T = TypeVar("_T")


@dataclass(frozen=True)
class FlagOptions:
    """The per-field exceptions to the derived flag (see :func:`flag`)."""

    name: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    env: str | None = None
    stage_env_only: bool = False
    enabled: bool = True


def flag(
    *,
    name: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    negate: bool = False,
    env: str | None = None,
    stage_env_only: bool = False,
) -> dict[str, FlagOptions]:
    """Field metadata (``field(default=..., metadata=flag(...))``) for a flag that differs from
    the derived one.

    ``name``: the option (default ``--field-name``). ``parse``: converts the text of a value and
    validates it (raise :class:`argparse.ArgumentTypeError` or ValueError), replacing the parser
    of the annotation. ``choices``: the accepted values (shown in the usage line). ``negate``: a
    ``bool`` field defaulting to True that the switch (give it a ``name`` such as
    ``--no-silence-stop``) turns off. ``env``: the ``KEY`` of the environment variables (default:
    from the flag name). ``stage_env_only``: read ``QWEN3TTS_<STAGE>_<KEY>`` only.
    """
    return {
        _METADATA_KEY: FlagOptions(
            name=name,
            parse=parse,
            choices=None if choices is None else tuple(choices),
            negate=negate,
            env=env,
            stage_env_only=stage_env_only,
        )
    }


NOT_A_FLAG: Mapping[str, FlagOptions] = types.MappingProxyType({_METADATA_KEY: FlagOptions(enabled=False)})
"""Field metadata of a field that is set by code, not on the command line."""


# ---------------------------------------------------------------------------------------------
# Value parsers


def positive_int(text: str) -> int:
    """An ``int`` > 0."""
    value = _scalar(int)(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An ``int`` >= 0."""
    value = _scalar(int)(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A ``float`` > 0 (NaN refused)."""
    value = _scalar(float)(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A ``float`` >= 0 (NaN refused)."""
    value = _scalar(float)(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (any case)."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value: {text!r} (use 1/true/yes/on or 0/false/no/off)")


def comma_list(text: str) -> tuple[str, ...]:
    """``" a:1 ,, b:2 "`` -> ``("a:1", "b:2")``: items stripped, empty items dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@functools.cache
def _scalar(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None

    parse.__name__ = kind.__name__
    return parse


def _parser_for(annotation: Any) -> Callable[[str], Any] | None:
    """The parser of a (non-bool) annotation, or None if there is no derived one."""
    if annotation is str:
        return str
    if annotation in (int, float):
        return _scalar(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        (inner,) = (arg for arg in args if arg is not type(None))
        parse_inner = _parser_for(inner)
        if parse_inner is None:
            return None
        return lambda text: parse_inner(text) if text != "" else None
    if origin in (tuple, frozenset):
        item = args[0] if args else str
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            return None
        parse_item = _parser_for(item)
        if parse_item is None:
            return None
        return lambda text: origin(parse_item(part) for part in comma_list(text))
    return None


# ---------------------------------------------------------------------------------------------
# Flags of a dataclass


@dataclass(frozen=True)
class Flag:
    """The flag of one dataclass field."""

    field: str
    """Field name, also the argparse ``dest``."""
    option: str
    """``--flag-name``."""
    env_key: str
    """``KEY`` of the ``QWEN3TTS_[<STAGE>_]KEY`` variables."""
    stage_env_only: bool
    parse: Callable[[str], Any]
    """Text of a value (command line or environment) -> field value; raises on malformed text."""
    switch: bool
    """Takes no value: giving the flag sets the field to ``not negate``."""
    negate: bool
    choices: tuple[str, ...] | None
    list_valued: bool
    doc: str
    """The field's attribute docstring (reStructuredText markup removed)."""
    _field: dataclasses.Field[Any]

    def default(self) -> Any:
        """The dataclass default of the field."""
        if self._field.default_factory is not dataclasses.MISSING:
            return self._field.default_factory()
        return self._field.default

    def env_names(self, stage: str) -> tuple[str, ...]:
        """The variables read for this flag in process ``stage``, most specific first."""
        return env_names(stage, self.env_key, stage_only=self.stage_env_only)


def env_names(stage: str, key: str, *, stage_only: bool = False) -> tuple[str, ...]:
    """``QWEN3TTS_<STAGE>_<KEY>`` then ``QWEN3TTS_<KEY>`` (the first only if ``stage_only``;
    the second only without a stage)."""
    key = key.upper()
    if not stage:
        return (f"{ENV_PREFIX}{key}",)
    specific = f"{ENV_PREFIX}{stage.upper()}_{key}"
    return (specific,) if stage_only else (specific, f"{ENV_PREFIX}{key}")


@functools.cache
def config_flags(cls: type) -> tuple[Flag, ...]:
    """The flags of dataclass ``cls``, in field order (fields marked :data:`NOT_A_FLAG` left
    out). Raises TypeError for a field whose flag cannot be derived (unsupported annotation,
    missing docstring, switch default inconsistent with ``negate``)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    docs = attribute_docstrings(cls)
    flags = []
    for field in dataclasses.fields(cls):
        options: FlagOptions = field.metadata.get(_METADATA_KEY, FlagOptions())
        if not options.enabled:
            continue
        where = f"{cls.__name__}.{field.name}"
        annotation = hints[field.name]
        option = options.name or "--" + field.name.replace("_", "-")
        switch = annotation is bool and options.parse is None
        if switch:
            if options.choices is not None:
                raise TypeError(f"{where}: a switch takes no choices")
        elif options.negate:
            raise TypeError(f"{where}: negate needs a bool field")
        parse = options.parse or (parse_bool if switch else _parser_for(annotation))
        if parse is None:
            raise TypeError(f"{where}: no flag parser for {annotation!r}; give flag(parse=...) or NOT_A_FLAG")
        if options.choices is not None:
            parse = _checking_choices(parse, options.choices)
        if field.name not in docs:
            raise TypeError(f"{where}: a flag field needs an attribute docstring (its help text)")
        flag_ = Flag(
            field=field.name,
            option=option,
            env_key=options.env or option.removeprefix("--").replace("-", "_").upper(),
            stage_env_only=options.stage_env_only,
            parse=parse,
            switch=switch,
            negate=options.negate,
            choices=options.choices,
            list_valued=typing.get_origin(annotation) in (tuple, frozenset),
            doc=docs[field.name],
            _field=field,
        )
        if switch and flag_.default() is not options.negate:
            # The switch sets ``not negate``; its absence must mean the other value.
            raise TypeError(
                f"{where}: a {'negated ' if options.negate else ''}switch needs default {options.negate}"
            )
        flags.append(flag_)
    return tuple(flags)


def _checking_choices(parse: Callable[[str], Any], choices: tuple[str, ...]) -> Callable[[str], Any]:
    def parse_choice(text: str) -> Any:
        value = parse(text)
        if value not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(map(repr, choices))})"
            )
        return value

    return parse_choice


@functools.cache
def attribute_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of the string literals that follow annotated assignments in the
    bodies of ``cls`` and its base classes (a subclass's docstring wins). Classes whose source is
    unavailable contribute nothing."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        (node,) = (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
        for statement, following in zip(node.body, node.body[1:]):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[statement.target.id] = _plain(inspect.cleandoc(following.value.value))
    return docs


def _plain(doc: str) -> str:
    """Docstring text without reStructuredText roles and literals markup."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    return " ".join(doc.replace("``", "").split())


# ---------------------------------------------------------------------------------------------
# argparse


class _EnvText(str):
    """A flag default taken from the environment: argparse converts string defaults with the
    flag's type after parsing, so a malformed variable becomes a usage error (and is never
    looked at when the flag is given)."""

    source: str

    def __new__(cls, text: str, source: str) -> _EnvText:
        value = super().__new__(cls, text)
        value.source = source
        return value


class _SwitchAction(argparse.Action):
    """``store_const`` with a ``type``, which converts an environment default (see
    :class:`_EnvText`)."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        const: Any,
        default: Any = None,
        type: Callable[[str], Any] | None = None,
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, type=type, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: Any) -> None:
        setattr(namespace, self.dest, self.const)


def _converter(flag_: Flag) -> Callable[[str], Any]:
    """argparse ``type`` of a flag: its parser, with the variable named in errors about an
    environment value; for a switch the text is an environment boolean."""

    def convert(text: str) -> Any:
        try:
            value = flag_.parse(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            message = str(exc) or f"invalid value: {text!r}"
            if isinstance(text, _EnvText):
                message = f"{message} (from {text.source})"
            raise argparse.ArgumentTypeError(message) from exc
        return value != flag_.negate if flag_.switch else value

    convert.__name__ = getattr(flag_.parse, "__name__", "value")
    return convert


def _shown(value: Any) -> str:
    """A default as it would be written on the command line."""
    if value is None:
        return ""
    if isinstance(value, frozenset):
        return ",".join(sorted(map(str, value)))
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    stage: str,
    env: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Add the flags of dataclass ``cls`` to ``parser`` (or an argument group).

    ``stage`` names the process in the environment variables (see the module doc; ``""`` reads
    ``QWEN3TTS_<KEY>`` only); ``env`` replaces ``os.environ``; ``defaults`` replaces dataclass
    defaults by field name (e.g. a per-process port).
    """
    environ = os.environ if env is None else env
    flags = config_flags(cls)
    unknown = set(defaults or ()) - {f.field for f in flags}
    if unknown:
        raise TypeError(f"defaults for fields that are not flags of {cls.__name__}: {sorted(unknown)}")
    for flag_ in flags:
        names = flag_.env_names(stage)
        source = next((name for name in names if environ.get(name, "") != ""), None)
        if source is not None:
            default: Any = _EnvText(environ[source], source)
            shown = default
        else:
            default = defaults[flag_.field] if defaults and flag_.field in defaults else flag_.default()
            shown = "off" if flag_.switch else _shown(default)
        doc = f"Disable: {flag_.doc}" if flag_.negate else flag_.doc
        kind = "comma-separated; " if flag_.list_valued else ""
        help_text = f"{doc} ({kind}env {' / '.join(names)}; default {shown})".replace("%", "%%")
        if flag_.switch:
            parser.add_argument(
                flag_.option,
                dest=flag_.field,
                action=_SwitchAction,
                const=not flag_.negate,
                default=default,
                type=_converter(flag_),
                help=help_text,
            )
        else:
            parser.add_argument(
                flag_.option,
                dest=flag_.field,
                type=_converter(flag_),
                choices=flag_.choices,
                default=default,
                help=help_text,
            )


def config_from_args(cls: type[_T], args: argparse.Namespace, **values: Any) -> _T:
    """``cls`` built from the flags parsed into ``args`` (added with :func:`add_config_flags`);
    ``values`` set the fields that are not flags (the others keep their defaults)."""
    flags = config_flags(cls)
    clash = {f.field for f in flags} & set(values)
    if clash:
        raise TypeError(f"{sorted(clash)} of {cls.__name__} come from flags, not from values")
    return cls(**{f.field: getattr(args, f.field) for f in flags}, **values)


__all__ = [
    "ENV_PREFIX",
    "NOT_A_FLAG",
    "Flag",
    "FlagOptions",
    "add_config_flags",
    "attribute_docstrings",
    "comma_list",
    "config_flags",
    "config_from_args",
    "env_names",
    "flag",
    "non_negative_float",
    "non_negative_int",
    "parse_bool",
    "positive_float",
    "positive_int",
]
