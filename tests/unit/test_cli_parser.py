"""The command line parses a worker's or the router's arguments without importing what only
other verbs need (benchmarks, chaos, ``up``'s cluster modules; each pool member parses twice:
before and after :func:`kvpool.confine.confine` re-executes it), and the whole parser still
has every verb."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvserve.cli import VERBS, build_parser
from kvserve.settings import SettingError

HEAVY = ("torch", "openai", "matplotlib", "transformers", "kvserve.cluster.netns")
"""What no service verb's parse imports: the engine and benchmark libraries, and ``up``'s
network namespaces (and through them its Redis launcher)."""
PROBE = """
import json, sys
from kvserve.cli import build_parser
build_parser(sys.argv[1]).parse_args(sys.argv[1:])
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


@pytest.mark.parametrize(
    "argv", [["router", "--router-port", "8001"], ["worker"], ["grant", "worker"]]
)
def test_parsing_a_service_verb_imports_nothing_heavy(argv: list[str]) -> None:
    code = PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == []


def test_the_whole_parser_knows_every_verb_and_a_verbs_parser_its_own_arguments() -> None:
    whole = build_parser()
    assert whole.parse_args(["bench", "hashing"]).what == "hashing"
    assert whole.parse_args(["sim", "ratio"]).what == "ratio"
    assert whole.parse_args(["up", "--routers", "2"]).routers == 2
    assert build_parser("chaos").parse_args(["chaos", "--requests", "3"]).requests == 3
    assert build_parser("up").parse_args(["up", "--routers", "2"]).routers == 2
    every = "{" + ",".join(verb.name for verb in VERBS) + "}"
    assert every in build_parser("worker").format_help()  # every verb listed, whichever is parsed
    with pytest.raises(SystemExit):  # listed, but without its arguments
        build_parser("worker").parse_args(["bench", "hashing"])
    with pytest.raises(SystemExit):
        build_parser("worker").parse_args(["up", "--routers", "2"])


def test_version_and_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvserve", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("kvserve ")
    assert build_parser("").parse_args(["--log-level", "DEBUG", "worker"]).log_level == "DEBUG"
    monkeypatch.setenv("KVSERVE_LOG_LEVEL", "warning")
    assert build_parser("").parse_args(["worker"]).log_level == "WARNING"
    monkeypatch.setenv("KVSERVE_LOG_LEVEL", "loud")
    with pytest.raises(SettingError, match="KVSERVE_LOG_LEVEL='LOUD'"):
        build_parser("")
