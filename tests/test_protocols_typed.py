"""Every Protocol checked against every implementation, in-memory twins included, twice:

* statically: ``mypy --strict`` checks this module (``make lint``, ``tests/test_types.py``), so an implementation
  whose methods drift from its Protocol (a parameter renamed or retyped, a method missing) fails there; each
  assignment ``x: Protocol = Impl(...)`` below is such a check;
* at runtime, as a normal test: each object is used through its Protocol type (a small round trip) and, where the
  Protocol is ``runtime_checkable``, checked with ``isinstance``.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from dledger.transport.base import PeerTransport
from dledger.transport.grpc import GrpcPeerTransport
from statemachine.api import CommittedEntry, StateMachine
from statemachine.counter import Counter, encode_add
from statemachine.kv import KVStore, encode_put
from storage import codec
from storage.api import HardState, LogPosition, LogStore, MetaStore
from storage.filestore import FileLogStore
from storage.memory import MemoryLogStore, MemoryMetaStore
from storage.meta_lmdb import LmdbMetaStore
from storage.powerloss import Journal, PowerLossFileIO, power_loss_meta_store

# -- storage -----------------------------------------------------------------------------------------------------


def _log_round_trip(store: LogStore) -> None:
    """Two entries appended and read back through nothing but ``LogStore``."""
    assert isinstance(store, LogStore)
    tail = store.tail()
    assert tail == LogPosition(-1, 0, 0, 0)
    first = codec.encode(0, 1, 0, b"one", 0)
    second_pos = codec.place(len(first), codec.HEADER_SIZE + 3, store.segment_size)
    second = codec.encode(1, 1, second_pos, b"two", codec.decode(first).header.chain_crc)
    assert store.append(first + second) == [0, second_pos]
    assert (store.first_index, store.last_index) == (0, 1)
    assert bytes(store.entry(1).body) == b"two"
    assert [bytes(e.body) for e in store.entries(0, 2)] == [b"one", b"two"]
    assert store.raw(0, 2) == first + second
    assert store.bodies_at([0, second_pos], [3, 3]) == b"onetwo"
    assert store.term(1) == 1
    store.sync()
    store.truncate_suffix(1)
    assert store.last_index == 0
    store.compact_prefix(1)
    assert store.snapshot_point().last_index == 0
    store.reset_to_snapshot(5, 2, 0, 4096)
    assert store.tail() == LogPosition(5, 2, 4096, 0)
    store.close()


def test_log_stores(tmp_path: Path) -> None:
    file_store: LogStore = FileLogStore.open(str(tmp_path / "log"), segment_size=1 << 16)
    memory_store: LogStore = MemoryLogStore(segment_size=1 << 16)
    journal = Journal(tmp_path / "powerloss")
    power_loss_store: LogStore = FileLogStore.open(
        str(tmp_path / "powerloss" / "log"), segment_size=1 << 16, io=PowerLossFileIO(journal)
    )
    for store in (file_store, memory_store, power_loss_store):
        _log_round_trip(store)


def _meta_round_trip(meta: MetaStore) -> None:
    assert isinstance(meta, MetaStore)
    assert meta.load_hard_state() == HardState()
    meta.save_hard_state(HardState(3, "n1"))
    assert meta.load_hard_state() == HardState(3, "n1")
    assert meta.get("k") is None
    meta.put("k", b"v", sync=True)
    assert meta.get("k") == b"v"
    meta.close()


def test_meta_stores(tmp_path: Path) -> None:
    lmdb_meta: MetaStore = LmdbMetaStore(str(tmp_path / "meta"))
    memory_meta: MetaStore = MemoryMetaStore()
    journal = Journal(tmp_path / "powerloss")
    power_loss_meta: MetaStore = power_loss_meta_store(journal)(str(tmp_path / "powerloss" / "meta"))
    for meta in (lmdb_meta, memory_meta, power_loss_meta):
        _meta_round_trip(meta)


# -- state machines ----------------------------------------------------------------------------------------------


def _state_machine_round_trip(sm: StateMachine, body: bytes, copy: StateMachine) -> None:
    """Apply one entry, snapshot, restore into a fresh instance: the copy's snapshot is the same bytes."""
    assert isinstance(sm, StateMachine)
    assert len(sm.apply([CommittedEntry(0, 1, 0, body)])) == 1
    saved = io.BytesIO()
    sm.save_snapshot(saved)
    copy.load_snapshot(io.BytesIO(saved.getvalue()))
    again = io.BytesIO()
    copy.save_snapshot(again)
    assert again.getvalue() == saved.getvalue()
    sm.close()
    copy.close()


def test_state_machines(tmp_path: Path) -> None:
    from broker_adapter.core.statemachine import BrokerStateMachine

    counter: StateMachine = Counter()
    kv: StateMachine = KVStore()
    broker: StateMachine = BrokerStateMachine(tmp_path / "consumequeue")
    _state_machine_round_trip(counter, encode_add(5), Counter())
    _state_machine_round_trip(kv, encode_put(b"k", b"v"), KVStore())
    assert isinstance(broker, StateMachine)
    broker_copy = BrokerStateMachine(tmp_path / "consumequeue-copy")
    saved = io.BytesIO()
    broker.save_snapshot(saved)  # its own tests (tests/broker) apply real commands to it
    broker_copy.load_snapshot(io.BytesIO(saved.getvalue()))
    broker.close()
    broker_copy.close()


# -- transport ---------------------------------------------------------------------------------------------------


def test_peer_transport() -> None:
    """``GrpcPeerTransport`` is the one ``PeerTransport`` (the simulator, tests/sim, steps cores directly)."""

    async def run() -> None:
        transport: PeerTransport = GrpcPeerTransport("g", {"b": "127.0.0.1:1"})
        assert isinstance(transport, PeerTransport)
        transport.set_reply_handler(lambda messages: None)
        await transport.close()

    asyncio.run(run())
