"""The ``--kv-staging`` mode the pool tests run under, from the setting's own variable.

``scripts/test.sh`` runs the pool, landing, hand-off and fault tests (marked ``kv_path``)
with ``KVSERVE_KV_STAGING=always`` (every transfer through the host staging slots of
:mod:`kvpool.span_io`) and the rest with the default (``auto``: a CPU cache moves in
place). Every pool a test makes takes its mode from here: :data:`STAGING` for a
:class:`~kvpool.config.PoolConfig`, :func:`pool_memory` for a :class:`~kvpool.pool.KVPool`
over a test's own slab.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from kvpool.config import PoolConfig
from kvpool.layout import KVLayout
from kvserve.settings import env_name
from workers.handoff.staging import SlabViews, TorchCopier

STAGING = os.environ.get(env_name("kv_staging"), PoolConfig.kv_staging)
TEST_SLOTS = 16
"""Slots of a test's staging copier: few, so a transfer takes several rounds (4 spans each)."""


def pool_memory(slab: np.ndarray, layout: KVLayout) -> int | TorchCopier:
    """What a :class:`~kvpool.pool.KVPool` over the host ``slab`` of ``layout`` takes: its
    address (moved in place), or under ``always`` a staging copier over it."""
    if STAGING != "always":
        return int(slab.ctypes.data)
    spans = slab.view(np.uint8).reshape(layout.num_layers, layout.num_blocks, layout.span_bytes)
    return TorchCopier(SlabViews(torch.from_numpy(spans)), TEST_SLOTS)
