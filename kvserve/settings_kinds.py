"""What a settings field's type means on a command line (:mod:`kvserve.settings`): how its
flag takes values (``nargs``), its choices, and how a variable's or a file's value is read
and checked, with errors that name the variable or the file key."""

from __future__ import annotations

import types
import typing
from argparse import ArgumentTypeError
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union


class SettingError(ValueError):
    """A ``KVSERVE_*`` variable or a ``--config`` key that does not fit its setting."""


_WHAT = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", Path: "a path"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings", Path: "paths"}


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); ValueError otherwise."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class Kind:
    """A field's type as the command line sees it.

    - ``scalar``: the type of one value (``bool``, ``int``, ``float``, ``str``, ``Path``...);
    - ``parse``: text -> one value (``scalar`` itself, or the field's ``parse`` metadata);
    - ``optional``: None is a value (an empty variable means None);
    - ``nargs``: None for one value, ``"+"``/``"*"`` for a list, a number for a tuple;
    - ``choices``: the allowed values (``Literal`` or ``choices`` metadata), or None.
    """

    scalar: Any
    parse: Callable[[str], Any]
    optional: bool = False
    nargs: int | str | None = None
    choices: tuple[Any, ...] | None = None

    def what(self) -> str:
        """What a value should be, for an error message."""
        if self.choices:
            return f"one of {', '.join(map(str, self.choices))}"
        if self.nargs is not None:
            return f"a list of {_PLURAL.get(self.scalar, 'values')}"
        return _WHAT.get(self.scalar, "valid")

    def _one(self, text: str) -> Any:
        value = parse_bool(text) if self.scalar is bool else self.parse(text)
        if self.choices is not None and value not in self.choices:
            raise _NotAChoiceError(value)
        return value

    def from_text(self, text: str) -> Any:
        """The value that ``text`` (a variable's) stands for; ValueError when none."""
        if self.optional and text == "":
            return None
        if self.nargs is None:
            return self._one(text)
        values = [self._one(word) for word in text.replace(",", " ").split()]
        if isinstance(self.nargs, int) and len(values) != self.nargs:
            raise ValueError(f"{self.nargs} values expected")
        return values

    def from_env(self, env: str, text: str | None) -> Any:
        """The value of variable ``env`` (set to ``text``; None when unset)."""
        if text is None:
            return None
        try:
            return self.from_text(text)
        except _NotAChoiceError as exc:
            raise SettingError(f"{env}={exc.value!r} is not {self.what()}") from None
        except (ValueError, TypeError, ArgumentTypeError):
            raise SettingError(f"{env}={text!r} is not {self.what()}") from None

    def check(self, value: Any) -> Any:
        """``value`` (a TOML file's) as this kind; ValueError when it is not one."""
        if self.optional and value is None:
            return None
        if self.nargs is not None:
            if not isinstance(value, list):
                raise ValueError("not a list")
            if isinstance(self.nargs, int) and len(value) != self.nargs:
                raise ValueError(f"{self.nargs} values expected")
            return [self._check_one(v) for v in value]
        return self._check_one(value)

    def _check_one(self, value: Any) -> Any:
        if self.scalar is bool:
            ok = isinstance(value, bool)
        elif self.scalar is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif self.scalar is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
            value = self.parse(value) if ok else value
        if not ok or (self.choices is not None and value not in self.choices):
            raise ValueError(f"not {self.what()}")
        return float(value) if self.scalar is float else value


class _NotAChoiceError(ValueError):
    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


def kind_of(hint: Any, metadata: Mapping[str, Any]) -> Kind:
    """The :class:`Kind` of a field typed ``hint`` with flag ``metadata``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    optional = False
    if origin in (Union, types.UnionType) and type(None) in args:
        optional = True
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    nargs: int | str | None = None
    if origin is list:
        nargs, hint = "+", args[0]
    elif origin is tuple:
        nargs = "+" if len(args) == 2 and args[1] is Ellipsis else len(args)
        hint = args[0]
    choices = metadata.get("choices")
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        hint = type(choices[0])
    parse = metadata.get("parse", hint)
    return Kind(
        scalar=hint,
        parse=parse,
        optional=optional,
        nargs=metadata.get("nargs", nargs),
        choices=tuple(choices) if choices is not None else None,
    )
