"""``kvserve <verb>``: the one command line of the project, a table of verbs.

Each verb's module declares its settings (:mod:`kvserve.verbs`): every flag is a field of a
settings dataclass, with its ``KVSERVE_*`` variable and its help (:mod:`kvserve.settings`),
and ``--config FILE`` reads a deployment's settings from TOML (:mod:`kvserve.settings_file`).
Run modules are imported only when their verb runs, and a verb's settings modules only
when that verb is parsed (or the whole parser asked for), so ``kvserve --help``, a worker
and the router start fast: a worker does not import what ``up``, the benchmarks or chaos
declare.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from kvserve.extras import missing_extra
from kvserve.hardening import forbid_inspection
from kvserve.settings import SettingError, add_config_args, setting
from kvserve.settings_file import active, config_path, load
from kvserve.verbs import Verb, add_verbs
from proto.package import package_version

VERBS = (
    Verb(
        "up",
        "run a whole cluster on this machine: pool, Redis, workers, router",
        "kvserve.cluster.up_settings",
        "kvserve.cluster.up",
    ),
    Verb(
        "worker",
        "serve one engine over gRPC (role prefill, decode or mixed)",
        "kvserve.verbs.worker",
    ),
    Verb("router", "the OpenAI-compatible HTTP API and the conductor", "kvserve.verbs.router"),
    Verb("generate", "generate text from the model through the engine", "kvserve.verbs.generate"),
    Verb(
        "prepare-model",
        "convert the shipped SmolLM2-135M-Instruct GGUF into a HF directory (offline)",
        "kvserve.verbs.prepare_model",
    ),
    Verb(
        "make-model",
        "write a deterministic tiny random-weight model",
        "kvserve.verbs.make_model",
    ),
    Verb("pool", "run a mooncake_master (the KV pool) for this machine", "kvserve.verbs.pool"),
    Verb(
        "chaos",
        "load on a loopback cluster while killing and restarting its parts",
        "kvserve.chaos.settings",
        "kvserve.chaos.run",
    ),
    Verb("bench", "benchmarks (one JSON object on stdout)", "kvserve.bench.cli", "-"),
    Verb("sim", "simulated cluster and P:D analyses (JSON)", "kvserve.sim.cli", "-"),
    Verb(
        "probe",
        "health check of a worker, router or pool service (0: healthy)",
        "kvserve.cluster.probe",
    ),
    Verb(
        "grant",
        "print the KVSERVE_CLUSTER_SECRET value to give a worker, router or monitor instead "
        "of the whole secret (read from KVSERVE_CLUSTER_SECRET; see docs/security.md)",
        "kvserve.verbs.grant",
    ),
)
"""Every verb of ``kvserve``, in the order ``--help`` lists them."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class CommonConfig:
    """Settings of every verb.

    - ``log_level``: what a worker or the router logs.
    """

    log_level: str = setting("INFO", choices=LOG_LEVELS, parse=str.upper)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (the verb about to be parsed, or ``""`` for
    none) every other verb is listed without its arguments, so that parsing one verb imports
    the settings modules of that verb alone."""
    parser = argparse.ArgumentParser(prog="kvserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvserve {package_version()}")
    parser.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="TOML file of settings, keys named as the fields (flags and variables win)",
    )
    add_config_args(parser, CommonConfig)
    add_verbs(parser, VERBS, "verb", lambda name: only is None or only == name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: this process's), run the verb; 2 on a setting's error.
    Run with this process's own arguments (as the ``kvserve`` command), the process is
    first closed to inspection by others of its user (:mod:`kvserve.hardening`)."""
    if argv is None:
        forbid_inspection()
    words = list(sys.argv[1:] if argv is None else argv)
    names = [v.name for v in VERBS]
    verb = next((w for w in words if w in names), "")
    try:
        path = config_path(words)
        layer = load(path, verb, names, words) if path else None
        with active(layer):
            parser = build_parser(verb)
        if layer is not None:
            layer.check_all_taken()
    except SettingError as exc:  # a malformed KVSERVE_* variable or file key: one line
        return _error(str(exc))
    except ModuleNotFoundError as exc:  # a benchmark verb's arguments, without its extra
        return _error(missing_extra(exc) or _reraise(exc))
    args = parser.parse_args(words)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        return _error(str(exc))
    except ModuleNotFoundError as exc:
        return _error(missing_extra(exc) or _reraise(exc))


def _error(message: str) -> int:
    """Print ``message`` as kvserve's one-line error; 2 (a usage or setup error)."""
    print(f"kvserve: error: {message}", file=sys.stderr)
    return 2


def _reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` again (a missing module no extra brings: a broken install)."""
    raise exc
