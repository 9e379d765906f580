"""Config dataclasses as CLI flags with environment variables of the same name.

A field ``kv_cache_mib`` of a config dataclass becomes the flag ``--kv-cache-mib`` whose
default is ``$KVSERVE_KV_CACHE_MIB`` if set, else the field's default. The dataclass's own
``__post_init__`` validates the result, so the rules live in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def add_config_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[Any],
    only: Collection[str] | None = None,
) -> None:
    """Add one flag per field of dataclass ``cls`` (defaults from the environment), or
    per field named in ``only``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        kind = hints[f.name]
        env = env_name(f.name)
        default = f.default
        flag = flag_name(f.name)
        help_text = f"(env {env}; default {default!r})"
        if kind is bool:
            value = _parse_bool(os.environ[env]) if env in os.environ else default
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=value, help=help_text
            )
        else:
            value = kind(os.environ[env]) if env in os.environ else default
            parser.add_argument(flag, type=kind, default=value, help=help_text)


def config_from_args(cls: type[T], ns: argparse.Namespace) -> T:
    """Build ``cls`` from the parsed flags added by :func:`add_config_args`."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: getattr(ns, f.name) for f in fields})


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
