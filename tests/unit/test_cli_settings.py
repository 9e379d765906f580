"""Every flag of every verb comes from a settings field: it has help, a ``KVSERVE_*``
variable, its choices shown; and ``--config FILE`` sits below flags and variables."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvserve.cli import build_parser, main
from kvserve.settings import SettingError
from kvserve.settings_file import FileLayer, active, load

NOT_YET: set[str] = set()
"""Verbs whose flags are still hand-written ``add_argument`` calls (issue 18: none left)."""
OWN_FLAGS = ("-h", "--help", "--version", "--config")


def verbs(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(verb path, parser)`` of every verb under ``parser``, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from verbs(sub, f"{path} {name}".strip())
    if path:
        yield path, parser


def flags(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and not set(action.option_strings) & set(OWN_FLAGS):
            yield action


def test_every_flag_of_every_verb_has_help_and_a_variable() -> None:
    missing = {
        f"{path} {action.option_strings[0]}"
        for path, parser in verbs(build_parser())
        if path not in NOT_YET
        for action in flags(parser)
        if "(env KVSERVE_" not in (action.help or "")
        or len((action.help or "").split("(env")[0].strip()) < 3
    }
    assert not missing, sorted(missing)
    assert {p for p, _ in verbs(build_parser())} >= NOT_YET


def test_choices_are_shown_in_the_help() -> None:
    parsers = dict(verbs(build_parser()))
    arch = next(a for a in flags(parsers["make-model"]) if a.dest == "arch")
    assert arch.choices == ("llama", "qwen2", "qwen3")
    assert "one of llama, qwen2, qwen3" in (arch.help or "")
    faults = next(a for a in flags(parsers["chaos"]) if a.dest == "faults")
    assert "kill-redis" in (faults.help or "") and faults.choices


def test_a_bad_variable_of_a_new_setting_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_UP_PREFILL", "two")
    with pytest.raises(SettingError, match=r"^KVSERVE_UP_PREFILL='two' is not an integer$"):
        build_parser("up")
    monkeypatch.delenv("KVSERVE_UP_PREFILL")
    monkeypatch.setenv("KVSERVE_CHAOS_FAULTS", "kill-decode,kill-moon")
    with pytest.raises(SettingError, match="KVSERVE_CHAOS_FAULTS='kill-moon' is not one of"):
        build_parser("chaos")


def _parse(tmp_path: Path, text: str, argv: list[str]) -> argparse.Namespace:
    path = tmp_path / "kvserve.toml"
    path.write_text(text)
    words = [*argv, "--config", str(path)]
    layer = load(str(path), argv[0], ["up", "worker", "router", "chaos"], words)
    with active(layer):
        parser = build_parser(argv[0])  # as kvserve.cli.main builds it for that verb
    layer.check_all_taken()
    return parser.parse_args(words)


def test_the_file_sits_below_variables_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "kv_cache_mib = 64\nprefill = 2\n[up]\ndecode = 3\n[worker]\nrole = 'prefill'\n"
    args = _parse(tmp_path, text, ["up"])
    assert (args.kv_cache_mib, args.prefill, args.decode) == (64, 2, 3)
    monkeypatch.setenv("KVSERVE_KV_CACHE_MIB", "32")
    assert _parse(tmp_path, text, ["up"]).kv_cache_mib == 32
    assert _parse(tmp_path, text, ["up", "--kv-cache-mib", "16"]).kv_cache_mib == 16
    monkeypatch.delenv("KVSERVE_KV_CACHE_MIB")
    assert _parse(tmp_path, "faults = ['kill-redis']\n", ["chaos"]).faults == ["kill-redis"]
    assert FileLayer.current().values == {}  # only while the parser is built


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kv_cache_mib = '1g'\n", "kv_cache_mib = '1g' is not an integer"),
        ("prefill_count = 1\n", "unknown setting 'prefill_count' for this command"),
        ("[moon]\nx = 1\n", "table [moon] names no verb"),
        ("use_pool = 'yes'\n", "use_pool = 'yes' is not a boolean"),
        ("kv_cache_mib = \n", "not TOML"),
    ],
)
def test_a_bad_file_key_is_one_line_naming_file_and_key(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    assert main(["up", "--config", str(path), "--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvserve: error: {path}: ") and message in err
    assert err.count("\n") == 1
