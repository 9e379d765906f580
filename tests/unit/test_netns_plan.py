"""How ``kvserve up`` launches: the secrets it makes up, what of its environment a child
sees, and with ``--hosts`` who gets which address, namespace, link name and account (the
namespaces themselves are made in tests/e2e/test_disaggregated.py; as root, the account
switch is tried for real here)."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

import kvserve.cli as cli
from kvserve.cluster.netns import PREFLIGHT, NetHosts, RunAs, accounts
from kvserve.cluster.plan import plan_cluster
from kvserve.cluster.processes import ManagedProcess, child_environment
from kvserve.cluster.up import client_key, net_hosts, spec_from_args

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")


def test_up_hosts_puts_every_process_on_its_own_address() -> None:
    args = cli.build_parser().parse_args(
        ["up", "--hosts", "--hosts-subnet", "10.77.0.0/28", "--hosts-tag", "kvq", "--decode", "2"]
    )
    spec = spec_from_args(args)
    net = net_hosts(spec, args)
    placed = net.place(spec)
    names = ["mooncake_master", "redis", "prefill-0", "decode-0", "decode-1", "router"]
    assert net.gateway == "10.77.0.1"
    assert {n: placed.host_of(n) for n in names} == {
        n: f"10.77.0.{i}" for i, n in enumerate(names, start=2)
    }
    worker = accounts()["worker"]
    assert placed.prefix_of("decode-1") == ("ip", "netns", "exec", "kvq-decode-1", *worker.prefix())
    assert placed.cluster.redis_password == spec.cluster.redis_password  # made up by the spec
    no_password = dataclasses.replace(
        spec, cluster=dataclasses.replace(spec.cluster, redis_password="")
    )
    assert net.place(no_password).cluster.redis_password  # never without one off loopback
    assert placed.router_url == "http://10.77.0.7:8000"


def test_link_names_fit_linux_limits() -> None:
    net = NetHosts([f"w{i}" for i in range(40)], "10.0.0.0/24", "abcdefgh")
    assert max(len(n) for n in (net.bridge, *net._veth.values())) <= 15
    assert len({*net._veth.values()}) == 40


@pytest.mark.parametrize(
    ("names", "subnet", "tag", "error"),
    [
        (["a"], "10.0.0.0/24", "Bad", "tag must be"),
        (["a"], "10.0.0.0/24", "waytoolongtag", "tag must be"),
        (["a", "a"], "10.0.0.0/24", "kv", "distinct"),
        (["a b"], "10.0.0.0/24", "kv", "distinct words"),
        (["a", "b", "c"], "10.0.0.0/30", "kv", "too few addresses"),
        (["a"], "fd00::/64", "kv", "IPv4"),
    ],
)
def test_bad_plans_are_refused(names: list[str], subnet: str, tag: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        NetHosts(names, subnet, tag)


def test_up_makes_up_secrets_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    made_up = spec_from_args(cli.build_parser().parse_args(["up"]))
    held = made_up.cluster
    assert held.cluster_secret and held.redis_password and made_up.api_key == ""
    monkeypatch.setenv("KVSERVE_CLUSTER_SECRET", "s" * 32)
    monkeypatch.setenv("KVSERVE_REDIS_PASSWORD", "pw")
    monkeypatch.setenv("KVSERVE_API_KEY", "alice=k1")
    ns = cli.build_parser().parse_args(["up", "--hash-algorithm", "xxh3"])
    given = spec_from_args(ns)
    assert (given.cluster.cluster_secret, given.cluster.redis_password) == ("s" * 32, "pw")
    assert (given.api_key, given.cluster.hash_algorithm) == ("alice=k1", "xxh3")
    router = plan_cluster(given, [0, 1]).router.argv
    assert router[router.index("--hash-algorithm") + 1] == "xxh3"
    assert [client_key(k) for k in ("alice=k1,k2", "k2, alice=k1", "")] == ["k1", "k2", ""]


LAUNCHER = {
    **{"PATH": "/bin", "HOME": "/h", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "3"},
    **{"CUDA_VISIBLE_DEVICES": "0", "KVSERVE_CACHE_DIR": "/c", "PYTHONPATH": "/p"},
    **{"KVSERVE_API_KEY": "k", "KVSERVE_REDIS_PASSWORD": "pw", "HF_TOKEN": "hf"},
    **{"KVSERVE_CLUSTER_SECRET": "s", "AWS_SECRET_ACCESS_KEY": "a", "KVSERVE_POLICY": "x"},
}


def test_children_inherit_only_the_allow_list() -> None:
    env = child_environment({"KVSERVE_CLUSTER_SECRET": "mine", "OMP_NUM_THREADS": "1"}, LAUNCHER)
    assert env == {
        **{"PATH": "/bin", "HOME": "/h", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"},
        **{"CUDA_VISIBLE_DEVICES": "0", "KVSERVE_CACHE_DIR": "/c", "PYTHONPATH": "/p"},
        "KVSERVE_CLUSTER_SECRET": "mine",
    }


def test_a_started_child_sees_only_the_allow_list_and_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LAUNCHER.items():
        if key not in ("PATH", "HOME", "PYTHONPATH"):
            monkeypatch.setenv(key, value)
    dump = "import json, os, sys; json.dump(dict(os.environ), sys.stdout); sys.stdin.read()"
    proc = ManagedProcess("env", [sys.executable, "-c", dump], tmp_path / "env.log", {"MINE": "1"})
    proc.start().wait(60)
    seen = json.loads((tmp_path / "env.log").read_text())
    assert seen["MINE"] == "1" and seen["PATH"] == os.environ["PATH"]
    leaked = {"KVSERVE_API_KEY", "KVSERVE_REDIS_PASSWORD", "HF_TOKEN", "KVSERVE_POLICY"}
    assert not leaked & set(seen)
    echo = [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"]
    fed = ManagedProcess("echo", echo, tmp_path / "echo.log", stdin=b"requirepass x\n")
    fed.start().wait(60)
    assert (tmp_path / "echo.log").read_text() == "requirepass x\n"


OTHER = next(p for p in pwd.getpwall() if p.pw_uid not in (0, 65534) and p.pw_gid != 0)
"""An account that is neither root nor nobody (Debian's daemon, bin, ...)."""


def test_processes_run_as_the_sudo_user_else_nobody_never_root() -> None:
    nobody = RunAs.of("nobody")
    sudo = {"SUDO_UID": str(OTHER.pw_uid), "SUDO_GID": "4242"}
    assert RunAs.invoker(sudo, euid=0) == RunAs(OTHER.pw_name, OTHER.pw_uid, 4242, OTHER.pw_dir)
    assert RunAs.invoker({}, euid=0) == nobody == RunAs.invoker({"SUDO_UID": "0"}, euid=0)
    assert RunAs.invoker({}, euid=OTHER.pw_uid).uid == OTHER.pw_uid
    for user in ("root", "0"):
        with pytest.raises(ValueError, match="not run as root"):
            RunAs.of(user)
    with pytest.raises(ValueError, match="no such user"):
        RunAs.of("no-such-user-here")
    assert nobody.prefix() == (
        *("setpriv", "--reuid=65534", "--regid=65534", "--init-groups", "--no-new-privs"),
        *("--pdeathsig", "keep", "--", "env", "HOME=/nonexistent", "USER=nobody"),
        "LOGNAME=nobody",
    )
    args = cli.build_parser().parse_args(["up", "--hosts", "--hosts-user", OTHER.pw_name])
    net = net_hosts(spec_from_args(args), args)
    assert net.prefix("router")[4:7] == (
        "setpriv",
        f"--reuid={OTHER.pw_uid}",
        f"--regid={OTHER.pw_gid}",
    )


def test_the_preflight_resolves_the_model_or_names_why_not(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for model, code in ((str(tmp_path), 0), (str(tmp_path / "none"), 1)):
        done = subprocess.run(
            [sys.executable, "-c", PREFLIGHT, model], capture_output=True, text=True
        )
        assert done.returncode == code, done.stderr
        assert ("cannot read the model" in done.stderr) == bool(code)
        assert done.stdout.strip() == ("" if code else str(tmp_path))


@AS_ROOT
def test_the_account_switch_takes_effect_and_is_checked(tmp_path: Path) -> None:
    """Run as nobody for real: its ids, groups and home; and ``kvserve up --hosts``'s
    check refuses, with a reason, what nobody cannot read (a model in pytest's 0700
    directory; here the interpreter itself may already be out of its reach)."""
    nobody = RunAs.of("nobody")
    ids = subprocess.run(
        [*nobody.prefix(), "sh", "-c", "id -u; id -g; id -G; echo $HOME"],
        capture_output=True, text=True, check=True, env=child_environment({}),
    ).stdout.split()  # fmt: skip
    assert ids == ["65534", "65534", "65534", "/nonexistent"]
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"processes run as nobody \(uid 65534\)"):
        nobody.model_dir(sys.executable, str(tmp_path))
