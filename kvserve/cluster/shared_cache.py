"""The build outputs a cluster's processes load, prepared by a root launcher where they
cannot write (``kvserve up --hosts`` as root).

Those processes run as unprivileged accounts (:mod:`kvserve.cluster.runas`) whose own cache
(``~/.cache/kvserve`` under their home, ``/nonexistent`` for ``nobody``) they cannot create:
without this, a worker could build neither the confinement library (its transfer-engine
ports then stayed on every interface, open to every peer) nor the native kernels (the
slower torch path). And a cache the processes shared and could write would let any of them
replace a library the others load at their next start.

:func:`prepare` builds both in the launcher's own cache (as the launcher would for
itself: nothing when they are built already), then copies them into a directory of the run
that root owns (directories 0755, files 0444), which every process gets as its
``KVSERVE_CACHE_DIR`` (:attr:`kvserve.cluster.runas.RunAs.cache`): each loads what the
launcher built and can write nothing there (``workers.model.native`` loads from a folder it
cannot write without taking the build lock). Lifecycle: :func:`prepare` before the
processes start; the caller removes the directory after they stopped.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)


def _install(source: Path, own: Path, dest: Path) -> None:
    """Copy ``source`` (a file under ``own``) to the same place under ``dest``, readable
    by everyone and writable by no one."""
    target = dest / source.relative_to(own)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(0o444)


def prepare(dest: Path) -> list[Path]:
    """Fill ``dest`` (made if missing) with the confinement library and the native kernels
    built for this machine; the files copied. What cannot be built is left out with a
    warning (the processes then warn and go on without it, as they would on their own)."""
    from kvpool.confine import build as build_confine
    from workers.model import native
    from workers.model.prepare import cache_dir

    own = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    built: list[Path] = []
    try:
        built.append(build_confine(own))
    except (RuntimeError, OSError) as exc:
        log.warning("cannot build the confinement library for the processes: %s", exc)
    try:
        native.build()
        built.append(native.library())
    except Exception as exc:  # the compiler's message, whatever raised it
        log.warning("cannot build the native kernels for the processes: %s", exc)
    for path in built:
        _install(path, own, dest)
    for folder, _, _ in os.walk(dest):
        Path(folder).chmod(0o755)
    return [dest / path.relative_to(own) for path in built]
