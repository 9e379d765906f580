"""A pool member that froze (SIGSTOP: a hung host, a stopped container) holds blocks another
member reads: the read is a miss within ``pool_transfer_timeout_s``, and the reader goes on
(it recomputes). Real ``mooncake_master``, real members in processes of their own.

Mooncake's TCP transport alone waits 30 s for a stalled transfer; a decode worker resuming a
request whose blocks sat in a frozen worker's segment stalled that long with every request
it held (seen in ``tests/e2e/test_dashboard.py``). The test's own time limit, far under
30 s and far over the 1 s set here, is what makes it able to fail. A second read does not
try the silent member again (``kvpool.peers``): with its connections dropped, Mooncake's next
one would redial it while the store's batch waits up to 60 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from kvpool.pool import KVPool
from kvpool.store import TRANSFER_TIMEOUT_VARIABLES, MooncakeStore
from tests.integration.pool_fixtures import (
    LAYOUT,
    NAMESPACE,
    chain,
    make_slab,
    pool_config,
    running_master,
)
from tests.staging import pool_memory
from workers.core.engine_info import PoolHealth

pytestmark = pytest.mark.kv_path


@contextmanager
def reader_of_a_writer(tmp_path: Path) -> Iterator[tuple[int, MooncakeStore, KVPool]]:
    """A member in a process of its own that wrote the 4 blocks of ``chain(5, 4)`` into its
    own segment, and a reader in this process (transfer timeout 1 s): the writer's pid, the
    reader's store and pool. Everything is stopped after, the writer thawed first."""
    with running_master(tmp_path) as master:
        argv = [sys.executable, "-m", "tests.integration.pool_writer"]
        argv += [master.rpc_address, master.metadata_url, "5", "4"]
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as w:
            assert w.stdin is not None and w.stdout is not None
            assert w.stdout.readline().strip() == "4"  # in the writer's own segment
            store = MooncakeStore.connect(replace(pool_config(master), pool_transfer_timeout_s=1))
            pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(make_slab(), LAYOUT), "reader")
            try:
                yield w.pid, store, pool
            finally:
                os.kill(w.pid, signal.SIGCONT)
                pool.close()
                store.close()  # waits for a call given up to end
                w.stdin.close()
                w.wait(30)


@pytest.mark.timeout(25)
def test_a_frozen_member_costs_a_reader_a_miss_not_a_stall(tmp_path: Path) -> None:
    with reader_of_a_writer(tmp_path) as (writer, store, pool):
        assert all(os.environ[name] == "1" for name in TRANSFER_TIMEOUT_VARIABLES)
        hashes = chain(5, 4)
        assert pool.lookup(hashes) == 4  # the master still lists them
        os.kill(writer, signal.SIGSTOP)
        assert pool.load(hashes, [0, 1, 2, 3]) == 0  # a miss, not a hang
        silent = store.peers.current()  # the frozen member, noted (kvpool.peers)
        assert len(silent) == 1 and store.segment() not in silent
        assert pool.load(hashes, [0, 1, 2, 3]) == 0
        assert store.peers.skipped > 0  # not even tried: no second wait
        assert pool.stats.checksum_failures == 0


@pytest.mark.timeout(25)
def test_a_value_read_from_a_frozen_member_is_given_up(tmp_path: Path) -> None:
    """A read of block metas that outlasts ``give_up_s`` answers misses at once, its call left
    to end on a reader thread (here at the transfer timeout), and the member holding them is
    skipped by the next read."""
    with reader_of_a_writer(tmp_path) as (writer, store, pool):
        metas = [pool.keys.meta_key(h) for h in chain(5, 4)]
        assert all(store.get_bytes(metas))  # a live member: every meta read
        store.give_up_s = 0.2  # under the transfer timeout: given up before it fails
        os.kill(writer, signal.SIGSTOP)
        assert store.get_bytes(metas) == [b""] * 4
        silent = store.peers.current()
        assert store.given_up == 1 and len(silent) == 1 and store.segment() not in silent
        assert store.get_bytes(metas) == [b""] * 4
        assert store.given_up == 1 and store.peers.skipped == 4  # not tried again
        health = PoolHealth.of(pool, probe=False)  # what /metrics exports
        assert (health.reads_given_up, health.objects_skipped) == (1, 4)
