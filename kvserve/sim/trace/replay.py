"""Pure replay of a Mooncake-format trace's prefix blocks: parsing, offline LRU, hit counts.

A trace line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids":
[...]}`` with one id per 512-token block of the prompt (the last one usually partial);
equal ids at the same position mean the whole prefix up to that block is identical.

Mapping into the pool's key space (:func:`block_chain`): block ``i`` of a request is named
``h_i = TRACE_HASHER.block(h_{i-1}, [hash_ids[i]])`` from the hasher's unsalted root, i.e.
the trace id stands in for the block's 512 tokens as one "token" of the real chained hash,
under the namespace :data:`TRACE_NAMESPACE` (its own text, so trace keys never collide with
a real model's) and a fixed public root key (a replay protects nothing). Equal id prefixes
therefore give equal hashes, and ``KeySpace.meta_key(h)`` is a real pool key. Every block
of the trace, the partial last one included, is a cacheable unit here (the trace names it;
the engine itself would recompute a partial last block).

Hit semantics everywhere (LRU, real pool, local caches): a request's hits are the longest
run of its *leading* blocks present before it runs; tokens are weighted 512 per block except
the last, which carries ``input_length - 512 * (blocks - 1)``. Then every block of the
request is inserted or refreshed, in chain order (as the engine frees a block table). The
LRU and the leading-hit count are the simulator's (:mod:`kvserve.sim.lru`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.hashing import Namespace, PrefixHasher
from kvserve.loadgen import mooncake_trace
from kvserve.loadgen.mooncake_trace import TraceEntry
from kvserve.sim.lru import LeafFirstLRU, LRUCache, leading

BLOCK_TOKENS = 512
"""Tokens per trace block (the Mooncake trace's fixed block size)."""

TRACE_NAMESPACE = Namespace(model="mooncake-trace", dtype="none", block_tokens=BLOCK_TOKENS)
"""The namespace every trace block key lives in."""
TRACE_HASHER = PrefixHasher(TRACE_NAMESPACE, root_key=b"kvserve trace replay (public)")
"""What names trace blocks (:func:`block_chain`): a fixed, public key."""


@dataclass(frozen=True)
class TraceRequest(TraceEntry):
    """A trace line whose hash ids are 512-token blocks (checked on construction);
    ``session``: the session it belongs to where the trace knows it (a generated trace:
    :mod:`kvserve.sim.trace.gen`), else -1 (a Mooncake trace names none)."""

    session: int = -1

    def __post_init__(self) -> None:
        need = -(-self.input_length // BLOCK_TOKENS)
        if self.input_length < 1 or len(self.hash_ids) != need:
            raise ValueError(
                f"trace line has {len(self.hash_ids)} hash_ids for input_length "
                f"{self.input_length}; expected ceil(input_length / {BLOCK_TOKENS}) = {need}"
            )

    def block_tokens(self) -> list[int]:
        """Tokens each block stands for: 512, except the (possibly partial) last one."""
        n = len(self.hash_ids)
        return [BLOCK_TOKENS] * (n - 1) + [self.input_length - BLOCK_TOKENS * (n - 1)]


@dataclass(frozen=True)
class Trace:
    """One replayed trace: its ``name``, ``requests``, their block ``chains``
    (:func:`block_chain`) and where it comes from (``source``: a path, or a generated
    shape's settings and seed). Loaded by :func:`kvserve.bench.trace.traces.load_traces`."""

    name: str
    requests: list[TraceRequest]
    chains: list[list[int]]
    source: dict[str, Any]


def parse_trace(lines: Iterable[str], max_requests: int | None = None) -> list[TraceRequest]:
    """Requests of the non-blank JSONL ``lines``, in file order, at most ``max_requests``."""
    return mooncake_trace.parse_trace(lines, max_requests, TraceRequest)


def load_trace(path: Path, max_requests: int | None = None) -> list[TraceRequest]:
    """The trace at ``path`` as 512-token-block requests (:func:`mooncake_trace.load_trace`)."""
    return mooncake_trace.load_trace(path, max_requests, TraceRequest)


def block_chain(hash_ids: Sequence[int], hasher: PrefixHasher = TRACE_HASHER) -> list[int]:
    """The chained pool hashes of a request's blocks (see the module docstring);
    ``ValueError`` if an id does not fit the 4-byte token encoding."""
    return hasher.chain(hash_ids, 1)


@dataclass
class HitCount:
    """Prefix hits over a replay, by blocks and by tokens."""

    requests: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    tokens: int = 0
    hit_tokens: int = 0

    def add(self, request: TraceRequest, hits: int) -> None:
        """Count one request whose first ``hits`` blocks were present."""
        weights = request.block_tokens()
        self.requests += 1
        self.blocks += len(weights)
        self.hit_blocks += hits
        self.tokens += request.input_length
        self.hit_tokens += sum(weights[:hits])

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0

    def row(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "blocks": self.blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_rate": round(self.block_hit_rate, 4),
            "tokens": self.tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": round(self.token_hit_rate, 4),
        }


def lru_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    capacity: int,
    leaf_first: bool = False,
) -> tuple[HitCount, LRUCache | LeafFirstLRU]:
    """Offline LRU of ``capacity`` blocks over the trace in order (``leaf_first``: evicting
    only chain tails, :class:`LeafFirstLRU`): count leading hits, then touch every block of
    the request. Returns the counts and the final cache."""
    cache = LeafFirstLRU(capacity) if leaf_first else LRUCache(capacity)
    count = HitCount()
    for request, chain in zip(requests, chains, strict=True):
        count.add(request, leading(chain, cache.__contains__))
        cache.touch(chain)
    return count, cache
