"""A pool member that did not answer a read has what it alone holds skipped by later reads
for a while (kvpool.peers through kvpool.store.MooncakeStore), against a fake binding whose
replica descriptors are shaped as Mooncake's; a value read that does not end in time is given
up, and the members holding its keys are skipped."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvpool.peers import TRANSFER_FAIL, UNREACHABLE_S
from kvpool.store import FAILED, MooncakeStore

OWN, A, B = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"


def replica(endpoint: str, status: str = "COMPLETE", memory: bool = True) -> Any:
    described = SimpleNamespace(buffer_descriptor=SimpleNamespace(transport_endpoint=endpoint))
    return SimpleNamespace(
        is_memory_replica=lambda: memory,
        get_memory_descriptor=lambda: described,
        status=SimpleNamespace(name=status),
    )


@dataclass
class Client:
    """The binding's verbs the reads use: ``where`` says where each key is, ``codes`` what
    a read of it gives (default: 8 bytes read); every key read is kept."""

    where: dict[str, list[Any]]
    codes: dict[str, int] = field(default_factory=dict)
    read: list[list[str]] = field(default_factory=list)
    lookups: int = 0
    closed: bool = False

    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.read.append(keys)
        return [self.codes.get(k, 8) for k in keys]

    def get_batch(self, keys: list[str]) -> list[bytes]:
        self.read.append(keys)
        return [b"" if self.codes.get(k, 8) < 0 else b"x" for k in keys]

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]:
        self.lookups += 1
        return {k: self.where[k] for k in keys if k in self.where}

    def get_hostname(self) -> str:
        return OWN

    def health_check(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store_of(client: Client, clock: Clock | None = None) -> MooncakeStore:
    store = MooncakeStore(client)
    if clock is not None:
        store.peers._clock = clock
    return store


def read(store: MooncakeStore, keys: list[str]) -> list[int]:
    return store.get_into(keys, list(range(len(keys))), [8] * len(keys))


WHERE = {
    "a1": [replica(A)],
    "a2": [replica(A)],
    "b1": [replica(B)],
    "ab": [replica(A), replica(B)],  # a second copy elsewhere: still worth a try
    "own": [replica(OWN)],
    "disk": [replica("", memory=False)],  # on the SSD tier only: the read decides
}


def test_without_a_failure_reads_cost_no_lookup() -> None:
    client = Client(WHERE)
    store = store_of(client)
    assert read(store, ["a1", "b1"]) == [8, 8]
    assert store.get_bytes(["a1"]) == [b"x"]
    assert client.lookups == 0 and store.peers.skipped == 0


def test_after_a_failed_transfer_what_only_that_member_holds_is_skipped_for_a_while() -> None:
    clock = Clock()
    client = Client(WHERE, codes={"a1": TRANSFER_FAIL})
    store = store_of(client, clock)
    assert read(store, ["a1", "b1"]) == [TRANSFER_FAIL, 8]
    assert store.peers.current() == {A}
    client.read.clear()
    keys = ["a2", "b1", "ab", "own", "disk", "gone"]
    assert read(store, keys) == [FAILED, 8, 8, 8, 8, 8]
    assert client.read == [["b1", "ab", "own", "disk", "gone"]]  # a2 never tried
    assert store.get_bytes(["a2", "b1"]) == [b"", b"x"]
    assert store.peers.skipped == 2
    clock.now += UNREACHABLE_S
    assert read(store, ["a2"]) == [8]  # tried again once the time is up
    assert store.peers.current() == set()


def test_only_complete_copies_elsewhere_are_noted() -> None:
    where = {"own": [replica(OWN)], "new": [replica(A, status="PROCESSING")], "gone": []}
    client = Client(where, codes=dict.fromkeys(where, TRANSFER_FAIL))
    store = store_of(client)
    read(store, list(where))
    assert store.peers.current() == set()  # this member's own, a copy being written, none


def test_a_metadata_read_notes_only_when_it_lasted_the_transfer_timeout() -> None:
    client = Client(WHERE, codes={"a1": TRANSFER_FAIL})
    store = store_of(client)
    store.transfer_timeout_s = 3600.0  # a quick call: an empty value is a miss
    assert store.get_bytes(["a1"]) == [b""]
    assert store.peers.current() == set()
    store.transfer_timeout_s = 0.0  # the call lasted the timeout (not given up): a silent member
    assert store.get_bytes(["a1", "b1"]) == [b"", b"x"]
    assert store.peers.current() == {A}


def test_a_master_that_cannot_say_where_keys_are_skips_nothing() -> None:
    class Blind(Client):
        def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]:
            raise RuntimeError("RPC_FAIL")

    client = Blind(WHERE, codes={"a1": TRANSFER_FAIL})
    store = store_of(client)
    read(store, ["a1"])
    assert store.peers.current() == set()
    client.codes.clear()
    assert read(store, ["a1", "a2"]) == [8, 8]


class Stuck(Client):
    """A binding whose value reads of ``stuck`` keys hang until :attr:`release` is set (as
    Mooncake's dial of a cut-off host does, for up to 60 s)."""

    def __init__(self, where: dict[str, list[Any]], stuck: set[str]) -> None:
        super().__init__(where)
        self.stuck = stuck
        self.release = threading.Event()

    def get_batch(self, keys: list[str]) -> list[bytes]:
        if self.stuck & set(keys):
            self.release.wait(30)
        return super().get_batch(keys)


def test_a_value_read_that_does_not_end_in_time_is_given_up() -> None:
    client = Stuck(WHERE, stuck={"a1"})
    store = store_of(client)
    store.give_up_s = 0.05
    try:
        assert store.get_bytes(["b1", "a1", "own"]) == [b"", b"", b""]  # misses, not waited for
        assert store.given_up == 1
        assert store.peers.current() == {A, B}  # which one held it up is not known
        client.read.clear()
        assert store.get_bytes(["ab", "own"]) == [b"", b"x"]  # only this member's own tried
        assert client.read == [["own"]]
    finally:
        client.release.set()
    store.close()  # waits for the call given up, then leaves
    assert client.closed
