"""Run as a separate process: join the pool, publish blocks of a seeded slab, exit.

``python -m tests.integration.pool_writer MASTER METADATA SEED N_BLOCKS``
"""

from __future__ import annotations

import sys

from kvpool.config import PoolConfig
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from tests.integration.pool_fixtures import LAYOUT, NAMESPACE, chain, make_slab
from tests.staging import pool_memory


def main() -> None:
    master, metadata, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = MooncakeStore.connect(
        PoolConfig(
            pool_master=master,
            pool_metadata_server=metadata,
            pool_segment_mib=64,
            pool_local_buffer_mib=16,
        )
    )
    slab = make_slab(seed)
    pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(slab, LAYOUT), writer="writer-proc")
    written = pool.save(chain(seed, n), list(range(n)))
    print(written, flush=True)
    # Stay until told to go: this process's segment holds the objects it wrote.
    sys.stdin.readline()
    pool.close()
    store.close()


if __name__ == "__main__":
    main()
