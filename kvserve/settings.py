"""Config dataclasses as CLI flags with environment variables of the same name.

A field ``kv_cache_mib`` of a config dataclass becomes the flag ``--kv-cache-mib`` whose
default is ``$KVSERVE_KV_CACHE_MIB`` if set, else the field's default. The dataclass's own
``__post_init__`` validates the result, so the rules live in one place. A flag's help is
the field's entry in its class docstring (a bullet ``- ``name``: what it is``), then its
variable and default. A variable that does not parse as its field's type is a
:class:`SettingError` naming the variable.

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
from collections.abc import Collection
from typing import Any, TypeVar

ENV_PREFIX = "KVSERVE_"
T = TypeVar("T")


def flag_name(field_name: str) -> str:
    """The command-line flag of a settings field: ``kv_cache_mib`` -> ``--kv-cache-mib``."""
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


class SettingError(ValueError):
    """A ``KVSERVE_*`` variable that does not parse as its setting's type."""


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
    return {name: text.replace("``", "") for name, text in docs.items()}


def _from_env(env: str, kind: Any, default: Any) -> Any:
    """The value of variable ``env`` as ``kind`` (``default`` when unset)."""
    if env not in os.environ:
        return default
    text = os.environ[env]
    try:
        return _parse_bool(text) if kind is bool else kind(text)
    except ValueError:
        what = {bool: "a boolean", int: "an integer", float: "a number"}.get(kind, "valid")
        raise SettingError(f"{env}={text!r} is not {what}") from None


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


FLAG_PREFIX = "flag_prefix"
"""The field metadata key naming a nested settings dataclass's flags (module docstring)."""


def _nested_prefix(f: dataclasses.Field[Any], kind: Any) -> str | None:
    """The name prefix of a nested settings field's flags, or None for a plain field."""
    if not dataclasses.is_dataclass(kind):
        return None
    return str(f.metadata.get(FLAG_PREFIX, f.name + "_"))


def add_config_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[Any],
    only: Collection[str] | None = None,
    prefix: str = "",
) -> None:
    """Add one flag per field of dataclass ``cls`` (defaults from the environment), or
    per field named in ``only``; nested settings fields add their class's flags."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        kind = hints[f.name]
        nested = _nested_prefix(f, kind)
        if nested is not None:
            add_config_args(parser, kind, prefix=prefix + nested)
            continue
        env = env_name(prefix + f.name)
        flag = flag_name(prefix + f.name)
        shown = "(secret)" if not f.repr else repr(f.default)
        help_text = f"{docs.get(f.name, '')} (env {env}; default {shown})".lstrip()
        value = _from_env(env, kind, f.default)
        if kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=value, help=help_text
            )
        else:
            parser.add_argument(flag, type=kind, default=value, help=help_text)


def config_from_args(cls: type[T], ns: argparse.Namespace, prefix: str = "") -> T:
    """Build ``cls`` from the parsed flags added by :func:`add_config_args`."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        nested = _nested_prefix(f, hints[f.name])
        if nested is None:
            values[f.name] = getattr(ns, prefix + f.name)
        else:
            values[f.name] = config_from_args(hints[f.name], ns, prefix + nested)
    return cls(**values)


def add_verb(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    run: typing.Callable[[argparse.Namespace], int],
    text: str,
) -> argparse.ArgumentParser:
    """A verb's parser under ``verbs``, described by ``text``, that runs ``run``."""
    parser = verbs.add_parser(name, help=text, description=text)
    parser.set_defaults(func=run)
    return parser
