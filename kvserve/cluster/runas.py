"""The unprivileged account that the processes of ``kvserve up --hosts`` run as
(:class:`RunAs`): the argv prefix that switches to it from root, and the model directory as
that account sees it (:data:`PREFLIGHT`). :mod:`kvserve.cluster.netns` puts the prefix
after ``ip netns exec``."""

from __future__ import annotations

import dataclasses
import os
import pwd
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from kvserve.cluster.processes import child_environment

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
    def invoker(cls, environ: Mapping[str, str] | None = None, euid: int | None = None) -> RunAs:
        """Whoever started this process: under sudo the invoking user (``SUDO_UID``, and
        ``SUDO_GID`` as its group), as root itself ``nobody``, else its own user.
        ``environ`` / ``euid`` default to this process's."""
        env = os.environ if environ is None else environ
        euid = os.geteuid() if euid is None else euid
        sudo_uid, sudo_gid = env.get("SUDO_UID", ""), env.get("SUDO_GID", "")
        if euid != 0:
            return cls.of(str(euid))
        if not sudo_uid.isdigit() or int(sudo_uid) == 0:
            return cls.of("nobody")
        who = cls.of(sudo_uid)
        return dataclasses.replace(who, gid=int(sudo_gid)) if sudo_gid.isdigit() else who

    def prefix(self) -> tuple[str, ...]:
        """The argv prefix that runs a command as this account (started as root)."""
        creds = (f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups")
        keep = ("--no-new-privs", "--pdeathsig", "keep", "--")
        account = (f"HOME={self.home}", f"USER={self.name}", f"LOGNAME={self.name}")
        return ("setpriv", *creds, *keep, "env", *account)

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
