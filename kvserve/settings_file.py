"""``--config FILE``: the settings a deployment keeps, in TOML.

Its keys are the settings' field names (as the flags' destinations: ``kv_cache_mib`` for
``--kv-cache-mib``); a table named after a verb (``[worker]``, ``[up]``...) holds keys for
that verb alone and wins over the top-level ones. Precedence: a flag beats a variable, a
variable the file, the file the default. A key the verb has no setting for, a value of the
wrong type or a table that names no verb is a :class:`SettingError` naming the file and
the key.
"""

from __future__ import annotations

import tomllib
from argparse import ArgumentTypeError
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from kvserve.settings_kinds import Kind, SettingError

CONFIG_FLAG = "--config"


class FileLayer:
    """The values of one ``--config`` file for the verb being parsed, and the keys taken.

    - ``path``: the file ('' for none);
    - ``values``: its keys for that verb;
    - ``words``: the command line's words: :func:`kvserve.verbs.add_verbs` applies the
      file to the verbs named there only.
    """

    _active: ClassVar[FileLayer | None] = None

    def __init__(
        self, path: str = "", values: dict[str, Any] | None = None, words: Sequence[str] = ()
    ) -> None:
        self.path = path
        self.values = values or {}
        self.words = frozenset(words)
        self.taken: set[str] = set()

    @classmethod
    def current(cls) -> FileLayer:
        """The layer that :func:`active` made current (an empty one outside it)."""
        return cls._active or FileLayer()

    def take(self, key: str, kind: Kind, default: Any) -> Any:
        """The file's value of ``key`` as ``kind`` (``default`` when absent)."""
        if key not in self.values:
            return default
        self.taken.add(key)
        value = self.values[key]
        try:
            return kind.check(value)
        except (ValueError, TypeError, ArgumentTypeError):
            raise SettingError(f"{self.path}: {key} = {value!r} is not {kind.what()}") from None

    def check_all_taken(self) -> None:
        """SettingError naming the first key no setting took."""
        unknown = sorted(set(self.values) - self.taken)
        if unknown:
            raise SettingError(f"{self.path}: unknown setting {unknown[0]!r} for this command")


@contextmanager
def active(layer: FileLayer | None) -> Iterator[None]:
    """Make ``layer`` the file layer that :func:`kvserve.settings.add_config_args` reads
    while the block runs (None: none)."""
    before = FileLayer._active
    FileLayer._active = layer
    try:
        yield
    finally:
        FileLayer._active = before


def config_path(words: Sequence[str]) -> str:
    """The value of ``--config FILE`` / ``--config=FILE`` in ``words`` ('' when absent)."""
    for i, word in enumerate(words):
        if word == CONFIG_FLAG and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(CONFIG_FLAG + "="):
            return word.split("=", 1)[1]
    return ""


def load(path: str, verb: str, verbs: Collection[str], words: Sequence[str]) -> FileLayer:
    """The layer of the TOML file ``path`` for ``verb`` (its top-level keys, then its
    ``[verb]`` table) on command line ``words``; SettingError when it cannot be read or
    names an unknown table."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise SettingError(f"{path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"{path}: not TOML ({exc})") from None
    values = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for table, keys in data.items():
        if isinstance(keys, dict) and table not in verbs:
            raise SettingError(f"{path}: table [{table}] names no verb")
    values.update(data.get(verb, {}))
    return FileLayer(path, values, words)
