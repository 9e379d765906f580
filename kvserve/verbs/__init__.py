"""The command line as tables of verbs: a :class:`Verb` names the module that declares its
settings and the module that runs it, and :func:`add_verbs` turns a table into sub-parsers
(``kvserve <verb>`` in :mod:`kvserve.cli`, ``kvserve bench <what>`` in
:mod:`kvserve.bench.cli`, ``kvserve sim <what>`` in :mod:`kvserve.sim.cli`).

A settings module has ``SETTINGS`` (settings dataclasses, one argument group each) or, when
it needs more (sub-verbs, a positional, other defaults), ``add_arguments(parser)``. A run
module has ``run(args) -> int``; it is imported only when its verb runs, so listing a verb
costs no heavy import.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvserve.settings import add_config_args
from kvserve.settings_file import FileLayer, active

if TYPE_CHECKING:
    from kvpool.config import PoolConfig

Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Verb:
    """One verb of a table.

    - ``name``: the word on the command line;
    - ``text``: its help line;
    - ``settings``: the module that declares its arguments (``SETTINGS`` or
      ``add_arguments``), or ``module:name`` for a tuple of settings classes or a function
      that adds the arguments;
    - ``runs``: ``module`` or ``module:function`` whose ``run(args)`` runs it ('' for the
      settings module; a verb with sub-verbs has none of its own: ``"-"``).
    """

    name: str
    text: str
    settings: str
    runs: str = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this verb's arguments to ``parser`` (importing its settings module)."""
        name, _, attr = self.settings.partition(":")
        module = importlib.import_module(name)
        if attr:
            found = getattr(module, attr)
        else:
            found = getattr(module, "add_arguments", None) or module.SETTINGS
        if isinstance(found, tuple):
            for cls in found:
                add_config_args(parser, cls)
        else:
            found(parser)
        if self.runs != "-":
            parser.set_defaults(func=self.runner())

    def runner(self) -> Run:
        """A function that imports the run module and runs the verb."""
        module, _, function = (self.runs or self.settings.partition(":")[0]).partition(":")

        def run(args: argparse.Namespace) -> int:
            return int(getattr(importlib.import_module(module), function or "run")(args))

        return run


def add_verbs(
    parser: argparse.ArgumentParser,
    table: Iterable[Verb],
    dest: str,
    built: Callable[[str], bool] = lambda name: True,
) -> None:
    """One sub-parser per verb of ``table`` under ``parser`` (the chosen one in ``dest``);
    a verb for which ``built(name)`` is false is listed without its arguments. The
    ``--config`` file applies to the verbs the command line names only."""
    verbs = parser.add_subparsers(dest=dest, required=True)
    layer = FileLayer.current()
    for verb in table:
        sub = verbs.add_parser(verb.name, help=verb.text, description=verb.text)
        sub.add_argument(
            "--config",
            default=argparse.SUPPRESS,
            metavar="FILE",
            help="TOML file of settings (kvserve.settings_file); flags and variables win",
        )
        if built(verb.name):
            with active(layer if verb.name in layer.words else None):
                verb.add_arguments(sub)


def start_logging(level: str) -> None:
    """Log lines of ``level`` and above to stderr, with time, level and logger."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def confine_first(pool: PoolConfig, joins: bool) -> None:
    """Before anything else, confine this process's Mooncake listeners to its pool address
    and its pool peers (:mod:`kvpool.confine`; may re-execute the process) when it joins
    the pool and ``pool.pool_confine`` is on."""
    if joins and pool.pool_confine:
        from kvpool.confine import confine
        from workers.model.prepare import cache_dir

        confine(pool.pool_local_hostname, cache_dir(), pool.pool_peers)
