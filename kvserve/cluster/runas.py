"""The unprivileged accounts that the processes of ``kvserve up --hosts`` run as
(:class:`RunAs`): the argv prefix that switches to one from root, and the model directory as
that account sees it (:data:`PREFLIGHT`). :mod:`kvserve.cluster.netns` puts the prefix
after ``ip netns exec``.

Each role has an account (:func:`accounts`, one per :data:`ROLES`, :func:`role_of` says
which a process has): the routers and the balancer, the workers, and the services (Redis,
the master). Started by plain root, the three are distinct accounts made up for the run
(:meth:`RunAs.transient`), so a broken-into worker cannot signal the router, nor a router a
worker; started through sudo, every role runs as the user who ran it (whose files the
processes read); ``--hosts-user`` names one account for all, or one per role."""

from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from kvserve.cluster.processes import child_environment
from kvserve.cluster.router_names import BALANCER, is_router

ROLES = ("router", "worker", "service")
"""The roles that each run as an account of their own."""
WORKER_PREFIXES = ("prefill-", "decode-", "mixed-")
TRANSIENT_UIDS = range(61184, 65520)
"""Where :meth:`RunAs.transient` finds ids: systemd's range for accounts made up at run time
(``DynamicUser``), which holds no account of its own on a normal system."""

PREFLIGHT = """
import os, sys
import kvserve.cli
from workers.model.prepare import default_model_dir
model = os.path.abspath(sys.argv[1] or default_model_dir())
if not os.access(os.path.join(model, "config.json"), os.R_OK):
    sys.exit(f"cannot read the model {model} (set KVSERVE_CACHE_DIR or --model)")
print(model)
"""
"""What :meth:`RunAs.model_dir` runs: prints the model directory (``argv[1]``, empty: the
default one) when this project imports and that model is readable, else exits non-zero
naming what is not."""


@dataclass(frozen=True)
class RunAs:
    """The unprivileged account processes run as on a namespace host: :meth:`prefix` goes
    after ``ip netns exec <ns>`` (which needs root) and switches to it with ``setpriv``
    (real and effective uid and gid, the account's groups, no new privileges, the
    parent-death signal kept), then sets HOME, USER and LOGNAME to the account's. Never
    root (ValueError)."""

    name: str
    uid: int
    gid: int
    home: str
    named: bool = True
    """Listed in the account database (its groups come from there); False: made up for the
    run (:meth:`transient`, no supplementary groups)."""
    cache: str = ""
    """The ``KVSERVE_CACHE_DIR`` its processes get (``kvserve.cluster.shared_cache``; empty:
    their own)."""

    def __post_init__(self) -> None:
        if self.uid == 0 or self.gid == 0:
            raise ValueError(f"processes must not run as root (user {self.name!r})")

    @classmethod
    def of(cls, user: str) -> RunAs:
        """The account ``user``: a name or a numeric uid (ValueError if there is none)."""
        try:
            entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"no such user: {user!r}") from None
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    @classmethod
    def invoking(
        cls, environ: Mapping[str, str] | None = None, euid: int | None = None
    ) -> RunAs | None:
        """Whoever started this process: under sudo the invoking user (``SUDO_UID``, and
        ``SUDO_GID`` as its group), else its own user; None for root itself (nobody to
        name). ``environ`` / ``euid`` default to this process's."""
        env = os.environ if environ is None else environ
        euid = os.geteuid() if euid is None else euid
        sudo_uid, sudo_gid = env.get("SUDO_UID", ""), env.get("SUDO_GID", "")
        if euid != 0:
            return cls.of(str(euid))
        if not sudo_uid.isdigit() or int(sudo_uid) == 0:
            return None
        who = cls.of(sudo_uid)
        return dataclasses.replace(who, gid=int(sudo_gid)) if sudo_gid.isdigit() else who

    @classmethod
    def invoker(cls, environ: Mapping[str, str] | None = None, euid: int | None = None) -> RunAs:
        """:meth:`invoking`, or ``nobody`` for root itself."""
        return cls.invoking(environ, euid) or cls.of("nobody")

    @classmethod
    def transient(cls, role: str, taken: set[int]) -> RunAs:
        """An account for ``role`` made up for the run: the first id of
        :data:`TRANSIENT_UIDS` that no account, no group and nothing in ``taken`` has (its
        group id too), home ``/nonexistent``."""
        for uid in TRANSIENT_UIDS:
            if uid not in taken and not _exists(uid):
                return cls(f"kvserve-{role}", uid, uid, "/nonexistent", named=False)
        raise ValueError(f"no free id in {TRANSIENT_UIDS} for a {role} account")

    def prefix(self) -> tuple[str, ...]:
        """The argv prefix that runs a command as this account (started as root)."""
        groups = "--init-groups" if self.named else "--clear-groups"
        creds = (f"--reuid={self.uid}", f"--regid={self.gid}", groups)
        keep = ("--no-new-privs", "--pdeathsig", "keep", "--")
        account = (f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}")
        cache = (f"KVSERVE_CACHE_DIR={self.cache}",) if self.cache else ()
        return ("setpriv", *creds, *keep, "env", *account, *cache)

    def model_dir(self, python: str, model: str, timeout: float = 120.0) -> str:
        """The model directory the processes use when run as this account: ``model``, or
        when empty the default model in the account's own cache, as an absolute path;
        found out by running :data:`PREFLIGHT` as the account with the environment a child
        would get (call as root). ValueError, saying why, when the account cannot start
        ``python`` with this project or read that model."""
        argv = [*self.prefix(), python, "-c", PREFLIGHT, model]
        done = subprocess.run(
            argv, capture_output=True, text=True, env=child_environment({}), timeout=timeout
        )
        if done.returncode == 0:
            return done.stdout.strip()
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ValueError(
            f"processes run as {self.name} (uid {self.uid}), which cannot start {python} "
            f"with kvserve: {why} (run through sudo as a user who can, or --hosts-user)"
        )


def _exists(uid: int) -> bool:
    """Whether an account or a group has id ``uid``."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        try:
            grp.getgrgid(uid)
        except KeyError:
            return False
    return True


def role_of(name: str) -> str:
    """The role (:data:`ROLES`) of process ``name``."""
    if is_router(name) or name == BALANCER:
        return "router"
    return "worker" if name.startswith(WORKER_PREFIXES) else "service"


def accounts(
    setting: str = "", environ: Mapping[str, str] | None = None, euid: int | None = None
) -> dict[str, RunAs]:
    """Each role's account for ``setting`` (``--hosts-user``): one account (a name or uid)
    for every role, or ``router=A,worker=B,service=C``; empty: the module docstring's
    default for a launcher with ``environ`` and ``euid`` (default: this process's).
    ValueError for an unknown account or role, a role left out, or root."""
    if "=" in setting:
        pairs: dict[str, str] = {}
        for part in setting.split(","):
            role, _, user = part.partition("=")
            pairs[role.strip()] = user
        if sorted(pairs) != sorted(ROLES) or setting.count("=") != len(ROLES):
            raise ValueError(f"--hosts-user names each of {', '.join(ROLES)} once, got {setting!r}")
        return {role: RunAs.of(pairs[role].strip()) for role in ROLES}
    if setting:
        return dict.fromkeys(ROLES, RunAs.of(setting))
    who = RunAs.invoking(environ, euid)
    if who is not None:
        return dict.fromkeys(ROLES, who)
    made: dict[str, RunAs] = {}
    for role in ROLES:
        made[role] = RunAs.transient(role, {a.uid for a in made.values()})
    return made
