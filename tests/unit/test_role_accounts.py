"""Which account each role of ``kvserve up --hosts`` runs as (:func:`accounts`), and the
build outputs a root launcher prepares for them where they cannot write
(:mod:`kvserve.cluster.shared_cache`); as root, both are tried for real with the accounts
made up for a run."""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from kvserve.cluster import shared_cache
from kvserve.cluster.netns import NetHosts
from kvserve.cluster.processes import child_environment
from kvserve.cluster.runas import ROLES, TRANSIENT_UIDS, RunAs, accounts, role_of
from tests.native_kernels import require_native
from workers.model import native

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")
OTHER = next(p for p in pwd.getpwall() if p.pw_uid not in (0, 65534) and p.pw_gid != 0)
"""An account that is neither root nor nobody (Debian's daemon, bin, ...)."""


def test_each_process_has_its_roles_account() -> None:
    roles = {
        "router": "router",
        "router-1": "router",
        "balancer": "router",
        "prefill-0": "worker",
        "decode-12": "worker",
        "mixed-1": "worker",
        "redis": "service",
        "mooncake_master": "service",
    }
    assert {name: role_of(name) for name in roles} == roles


def test_plain_root_makes_up_one_account_per_role() -> None:
    made = accounts("", {}, euid=0)
    assert sorted(made) == sorted(ROLES)
    uids = {a.uid for a in made.values()}
    assert len(uids) == len(ROLES) and uids <= set(TRANSIENT_UIDS)
    for role, account in made.items():
        assert account.name == f"kvserve-{role}" and account.gid == account.uid
        with pytest.raises(KeyError):
            pwd.getpwuid(account.uid)  # nobody else's
        assert account.prefix()[:4] == (
            "setpriv",
            f"--reuid={account.uid}",
            f"--regid={account.uid}",
            "--clear-groups",
        )


def test_sudo_a_user_or_one_per_role_otherwise() -> None:
    sudo = accounts("", {"SUDO_UID": str(OTHER.pw_uid)}, euid=0)
    assert set(sudo.values()) == {RunAs.of(str(OTHER.pw_uid))}
    assert set(accounts(OTHER.pw_name).values()) == {RunAs.of(OTHER.pw_name)}
    given = accounts(f"worker={OTHER.pw_name}, router=nobody,service={OTHER.pw_uid}")
    assert given["worker"] == given["service"] == RunAs.of(OTHER.pw_name)
    assert given["router"] == RunAs.of("nobody")
    for bad in ("router=nobody,worker=nobody", "router=nobody,worker=nobody,db=nobody"):
        with pytest.raises(ValueError, match="names each of router, worker, service"):
            accounts(bad)
    with pytest.raises(ValueError, match="not run as root"):
        accounts("router=nobody,worker=root,service=nobody")


def test_hosts_run_each_process_as_its_roles_account_with_the_shared_cache() -> None:
    made = {role: RunAs.transient(role, set()) for role in ROLES}
    made["router"] = RunAs.of("nobody")
    net = NetHosts(["redis", "prefill-0", "router"], "10.9.0.0/29", "kvr", made)
    assert net.prefix("router")[4:6] == ("setpriv", "--reuid=65534")
    assert net.prefix("prefill-0")[5] == f"--reuid={made['worker'].uid}"
    cached = dataclasses.replace(made["service"], cache="/c")
    assert cached.prefix()[-1] == "KVSERVE_CACHE_DIR=/c"
    assert not any(part.startswith("KVSERVE_CACHE_DIR") for part in made["worker"].prefix())


def test_the_shared_cache_holds_read_only_copies_that_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_native()
    files = shared_cache.prepare(tmp_path / "shared")
    assert {f.parent.parent.name for f in files} >= {"shared", "kernels"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    # a process that cannot write the folder loads the copy as it is, taking no lock
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(tmp_path / "shared"))
    monkeypatch.setattr(os, "access", lambda _path, _mode: False)
    module = native._load()
    assert module.__spec__ is not None
    assert Path(str(module.__spec__.origin)) == native.library()
    assert not (native.build_dir() / "build.flock").exists()


@AS_ROOT
def test_an_account_made_up_for_the_run_loads_the_shared_cache_and_writes_nothing() -> None:
    with tempfile.TemporaryDirectory(prefix="kvserve-cache-") as made:  # as kvserve up's
        shared(Path(made))


def shared(cache: Path) -> None:
    confine_lib = next(p for p in shared_cache.prepare(cache) if p.parent.name == "confine")
    worker = RunAs.transient("worker", set())
    run = [*worker.prefix(), "sh", "-c", f'id -u; id -G; touch "{cache}/planted" || echo refused']
    done = subprocess.run(
        run,
        capture_output=True,
        text=True,
        check=True,
        env={**child_environment({}), "LD_PRELOAD": str(confine_lib)},
    )
    assert done.stdout.split() == [str(worker.uid), str(worker.uid), "refused"], done.stderr
    assert "cannot be preloaded" not in done.stderr
    assert not (cache / "planted").exists()
