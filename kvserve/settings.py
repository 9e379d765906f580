"""Config dataclasses as CLI flags with environment variables of the same name.

A field ``kv_cache_mib`` of a config dataclass becomes the flag ``--kv-cache-mib`` whose
default is ``$KVSERVE_KV_CACHE_MIB`` if set, else the value of the ``--config`` file
(:mod:`kvserve.settings_file`) if it has the key, else the field's default: a flag beats a
variable, a variable the file, the file the default. The dataclass's own ``__post_init__``
validates the result, so the rules live in one place. A flag's help is the field's entry in
its class docstring (a bullet ``- ``name``: what it is``), then its choices, variable and
default; each class's flags form one argument group. A variable that does not parse as its
field's type is a :class:`SettingError` naming the variable.

Types: ``bool`` (``--x`` / ``--no-x``), ``int``, ``float``, ``str``, ``Path``, any of them
``| None``, ``Literal[...]`` (the choices), ``list[X]`` (several values; in a variable
separated by commas or spaces) and ``tuple[X, X]`` (exactly that many). Field metadata
(:func:`setting`) adds ``choices``, ``aliases`` (more flag names), ``nargs``, ``metavar``,
``parse`` (a function from text to value), ``append`` (repeatable flag) and ``positional``
(an argument without flag or variable).

A class whose variables would collide with another meaning of the same name sets the class
attribute ``env_prefix`` (:data:`ENV_PREFIX_ATTR`, e.g. ``"KVSERVE_BENCH_"``).

A field whose type is itself a settings dataclass contributes that class's fields, each
named with the field's ``metadata["flag_prefix"]`` (default: the field's name and ``_``)
before it: ``ratio: RatioConfig`` with prefix ``controller_`` gives ``--controller-target``
/ ``KVSERVE_CONTROLLER_TARGET`` for ``RatioConfig.target``. The nested class is defined
once, with its defaults and docs, and nothing restates it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import typing
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from kvserve.settings_file import FileLayer
from kvserve.settings_kinds import Kind, SettingError, kind_of, parse_bool

__all__ = [
    "BENCH_ENV",
    "ENV_PREFIX",
    "SettingError",
    "add_config_args",
    "config_from_args",
    "env_name",
    "field_docs",
    "flag_name",
    "parse_bool",
    "setting",
]

ENV_PREFIX = "KVSERVE_"
ENV_PREFIX_ATTR = "env_prefix"
"""The class attribute that replaces :data:`ENV_PREFIX` for one settings class."""
BENCH_ENV = "KVSERVE_BENCH_"
"""The :data:`ENV_PREFIX_ATTR` of the benchmarks' settings and of the load settings they
share with the simulator (:mod:`kvserve.loadgen.options`)."""
FLAG_PREFIX = "flag_prefix"
"""The field metadata key naming a nested settings dataclass's flags (module docstring)."""
T = TypeVar("T")
Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def flag_name(field_name: str) -> str:
    """The command-line flag of a settings field: ``kv_cache_mib`` -> ``--kv-cache-mib``."""
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str, prefix: str = ENV_PREFIX) -> str:
    """The variable of a settings field: ``kv_cache_mib`` -> ``KVSERVE_KV_CACHE_MIB``."""
    return prefix + field_name.upper()


def setting(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A dataclass field with flag metadata (module docstring); a list default is copied
    for each instance."""
    if isinstance(default, list):
        items = list(default)
        return dataclasses.field(default_factory=lambda: list(items), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_ROLE = re.compile(r":\w+:`~?([^`]+)`")
"""A Sphinx cross-reference (``:data:`X```): its target is what a reader of ``--help`` sees."""
_BULLET = re.compile(r"^\s*- ((?:``\w+``(?:\s*(?:/|,|and)\s*)?)+):\s*(.*)$")


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's description from ``cls``'s docstring bullets (``- ``a`` / ``b``: text``,
    continued on indented lines; the text of a bullet naming several fields goes to each)."""
    docs: dict[str, str] = {}
    names: list[str] = []
    for line in (cls.__doc__ or "").splitlines():
        found = _BULLET.match(line)
        if found:
            names = re.findall(r"``(\w+)``", found.group(1))
            for name in names:
                docs[name] = found.group(2).strip()
        elif names and line.strip() and not line.lstrip().startswith("- "):
            for name in names:
                docs[name] += " " + line.strip()
        else:
            names = []
    return {name: _ROLE.sub(r"\1", text.replace("``", "")) for name, text in docs.items()}


def group_text(cls: type[Any]) -> tuple[str, str]:
    """The argument group of ``cls``'s flags: its name and its docstring's first paragraph."""
    first = (cls.__doc__ or "").strip().split("\n\n")[0]
    return cls.__name__, " ".join(first.split()).replace("``", "")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _nested_prefix(f: dataclasses.Field[Any], kind: Any) -> str | None:
    """The name prefix of a nested settings field's flags, or None for a plain field."""
    if not dataclasses.is_dataclass(kind):
        return None
    return str(f.metadata.get(FLAG_PREFIX, f.name + "_"))


def add_config_args(
    parser: Parser,
    cls: type[Any],
    only: Collection[str] | None = None,
    prefix: str = "",
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Add one flag per field of dataclass ``cls`` (defaults from the environment, then the
    ``--config`` file, then ``defaults``, then the field), or per field named in ``only``;
    nested settings fields add their class's flags. Given a parser, the flags go to an
    argument group of their own; given a group, into that group."""
    target = parser
    if isinstance(parser, argparse.ArgumentParser):
        target = parser.add_argument_group(*group_text(cls))
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    env_prefix = str(getattr(cls, ENV_PREFIX_ATTR, ENV_PREFIX))
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        nested = _nested_prefix(f, hints[f.name])
        if nested is not None:
            add_config_args(parser, hints[f.name], prefix=prefix + nested, defaults=defaults)
            continue
        kind = kind_of(hints[f.name], f.metadata)
        dest = prefix + f.name
        default = (defaults or {}).get(dest, _default(f))
        _add_flag(target, f, kind, dest, docs.get(f.name, ""), env_prefix, default)


def _add_flag(
    target: Parser,
    f: dataclasses.Field[Any],
    kind: Kind,
    dest: str,
    doc: str,
    env_prefix: str,
    default: Any,
) -> None:
    """One field's argument: its flag(s), value from the layers, help and choices."""
    meta = f.metadata
    if meta.get("positional"):
        nargs = meta.get("nargs", kind.nargs)
        extra: dict[str, Any] = {} if default is dataclasses.MISSING else {"default": default}
        target.add_argument(
            dest, type=kind.parse, nargs=nargs, choices=kind.choices, help=_escape(doc), **extra
        )
        return
    env = env_name(dest, env_prefix)
    value = FileLayer.current().take(dest, kind, default)  # checked even when overridden
    if env in os.environ:
        value = kind.from_env(env, os.environ[env])
    required = value is dataclasses.MISSING
    shown = "(secret)" if not f.repr else repr(value if value is not None else default)
    choices = f"; one of {', '.join(map(str, kind.choices))}" if kind.choices else ""
    said = "required" if required else f"default {shown}"
    help_text = _escape(f"{doc.rstrip(';')} (env {env}{choices}; {said})".lstrip())
    flags = [flag_name(dest), *meta.get("aliases", ())]
    common: dict[str, Any] = {"dest": dest, "help": help_text, "default": value}
    if required:
        common = {"dest": dest, "help": help_text, "required": True}
    if kind.scalar is bool and kind.nargs is None:
        target.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
    elif meta.get("append"):
        target.add_argument(*flags, action="append", type=kind.parse, **common)
    else:
        target.add_argument(
            *flags,
            type=kind.parse,
            nargs=kind.nargs,
            choices=kind.choices,
            metavar=meta.get("metavar"),
            **common,
        )


def _escape(text: str) -> str:
    """``text`` safe for argparse's %-formatting of help strings."""
    return text.replace("%", "%%")


def config_from_args(cls: type[T], ns: argparse.Namespace, prefix: str = "") -> T:
    """Build ``cls`` from the parsed flags added by :func:`add_config_args`."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        nested = _nested_prefix(f, hints[f.name])
        if nested is None:
            values[f.name] = getattr(ns, prefix + f.name)
        else:
            values[f.name] = config_from_args(hints[f.name], ns, prefix + nested)
    return cls(**values)
