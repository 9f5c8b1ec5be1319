"""A 3-node PySyncObj group for the comparison, each node its own process with a small TCP front.

PySyncObj (the Python Raft library, bakwc/PySyncObj) has no network client protocol: a program replicates a
class by calling its ``@replicated`` methods in one of the group's processes. So each node process here runs
a ``ReplicatedCounter(SyncObj)`` plus an asyncio TCP server, the *front*, that turns a request into a
``@replicated`` call and answers when PySyncObj calls back with the outcome. Calls made on a follower are
forwarded to the leader by PySyncObj itself.

Timing: election timeouts 150-300 ms, heartbeat (``appendEntriesPeriod``) 40 ms, as issue 8 asks (the library
requires the minimum timeout to exceed three heartbeats). The log is PySyncObj's in-memory journal: PySyncObj
never fsyncs, so its acknowledgements are not durable; every figure says so.

The front's framing (big-endian): a request is ``u32 length, u64 request id, u8 op, payload``; the answer is
``u32 length, u64 request id, u8 status (0 ok, else failed), payload``. Ops: 1 = append one value, 2 = append a
batch (payload: ``u32 count`` then ``u32 length, bytes`` per value; one ``@replicated`` call carries the whole
batch, PySyncObj's best batched path), 3 = status (answer: JSON). Requests are pipelined on one connection, so
one client connection shared by many writers costs about what our client's shared stream costs.

    python -m bench.compare.pysyncobj_group --self 127.0.0.1:P --partners A,B --front PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import struct
import sys
import time
from pathlib import Path

from bench.compare.base import LeaderView, ProcessRegistry, free_ports, poll_until

HEAD = struct.Struct(">IQB")  # length of what follows the length field, request id, op or status
OP_PUT, OP_PUT_MANY, OP_STATUS = 1, 2, 3
OK = 0
LEADER_STATE = 2  # PySyncObj's _RAFT_STATE.LEADER


def encode_values(values: list[bytes]) -> bytes:
    parts = [struct.pack(">I", len(values))]
    for v in values:
        parts.append(struct.pack(">I", len(v)))
        parts.append(v)
    return b"".join(parts)


def decode_values(payload: bytes) -> list[bytes]:
    (count,) = struct.unpack_from(">I", payload, 0)
    off, out = 4, []
    for _ in range(count):
        (n,) = struct.unpack_from(">I", payload, off)
        off += 4
        out.append(payload[off : off + n])
        off += n
    return out


# -- the node process ----------------------------------------------------------------------------------------


def _node_main(args: argparse.Namespace) -> int:
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

    class ReplicatedCounter(SyncObj):
        """The replicated state: how many values and bytes were appended (the values themselves stay in
        PySyncObj's log, as they stay in ours and in etcd's)."""

        def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf):
            super().__init__(self_addr, partners, conf)
            self.count = 0
            self.nbytes = 0

        @replicated
        def append(self, value: bytes) -> int:
            self.count += 1
            self.nbytes += len(value)
            return self.count

        @replicated
        def append_many(self, values: list[bytes]) -> int:
            self.count += len(values)
            self.nbytes += sum(len(v) for v in values)
            return self.count

    conf = SyncObjConf(
        raftMinTimeout=0.15,
        raftMaxTimeout=0.3,
        appendEntriesPeriod=0.04,
        connectionRetryTime=0.5,  # reconnect to a restarted member soon (not a Raft timing)
        dynamicMembershipChange=False,
    )
    obj = ReplicatedCounter(args.self_addr, [p for p in args.partners.split(",") if p], conf)
    reasons = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}

    def status() -> dict:
        for _ in range(5):  # getStatus iterates dicts the tick thread may be changing
            try:
                st = obj.getStatus()
                break
            except RuntimeError:
                continue
        else:
            raise RuntimeError("PySyncObj status kept changing under iteration")
        return {
            "self": str(st["self"]),
            "state": st["state"],
            "leader": str(st["leader"]) if st["leader"] is not None else None,
            "term": st["raft_term"],
            "commit_idx": st["commit_idx"],
        }

    async def serve() -> None:
        loop = asyncio.get_running_loop()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            def answer(req_id: int, code: int, payload: bytes) -> None:
                if not writer.is_closing():
                    writer.write(HEAD.pack(9 + len(payload), req_id, code) + payload)

            def done(req_id: int, result, error) -> None:  # called on PySyncObj's tick thread
                if error == FAIL_REASON.SUCCESS:
                    loop.call_soon_threadsafe(answer, req_id, OK, struct.pack(">Q", result))
                else:
                    reason = reasons.get(error, str(error)).encode()
                    loop.call_soon_threadsafe(answer, req_id, 1, reason)

            try:
                while True:
                    head = await reader.readexactly(HEAD.size)
                    length, req_id, op = HEAD.unpack(head)
                    payload = await reader.readexactly(length - 9)
                    if op == OP_PUT:
                        obj.append(payload, callback=lambda r, e, i=req_id: done(i, r, e))
                    elif op == OP_PUT_MANY:
                        obj.append_many(decode_values(payload), callback=lambda r, e, i=req_id: done(i, r, e))
                    elif op == OP_STATUS:
                        answer(req_id, OK, json.dumps(status()).encode())
                    else:
                        answer(req_id, 1, f"unknown op {op}".encode())
            except (asyncio.IncompleteReadError, ConnectionError):
                pass  # the client went away: nothing to answer
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", args.front)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        async with server:
            await stop.wait()

    try:
        asyncio.run(serve())
    finally:
        obj.destroy()
    return 0


# -- the client (in the harness process) ---------------------------------------------------------------------


class FrontError(Exception):
    """A front answered with a failure (PySyncObj's FAIL_REASON name) or the connection broke."""


class FrontClient:
    """One pipelined connection to one node's front; concurrent callers share it."""

    def __init__(self, address: str):
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        async with self._lock:
            if self._writer is not None and not self._writer.is_closing():
                return
            host, port = self.address.rsplit(":", 1)
            self._reader, self._writer = await asyncio.open_connection(host, int(port))
            self._read_task = asyncio.create_task(self._read_loop(self._reader))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await reader.readexactly(HEAD.size)
                length, req_id, code = HEAD.unpack(head)
                payload = await reader.readexactly(length - 9)
                fut = self._pending.pop(req_id, None)
                if fut is not None and not fut.done():
                    if code == OK:
                        fut.set_result(payload)
                    else:
                        fut.set_exception(FrontError(payload.decode(errors="replace")))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self._fail_all(FrontError(f"{self.address}: connection lost ({e!r})"))

    def _fail_all(self, err: Exception) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    async def call(self, op: int, payload: bytes = b"") -> bytes:
        if self._writer is None or self._writer.is_closing():
            await self._connect()
        assert self._writer is not None
        req_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        self._writer.write(HEAD.pack(9 + len(payload), req_id, op) + payload)
        try:
            return await fut
        finally:
            self._pending.pop(req_id, None)

    async def status(self) -> dict:
        return json.loads(await self.call(OP_STATUS))

    async def close(self) -> None:
        if self._read_task is not None:
            self._read_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._read_task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        self._writer = None


class _PsoLoad:
    """Writes go to one front (the leader's) for throughput. A failover client sends each write to the next
    member in turn (any live member forwards to the leader), so no write waits on a member it cannot know is
    dead, and no member is favoured."""

    def __init__(self, fronts: list[str], first: int, rotate: bool):
        self._clients = [FrontClient(a) for a in fronts]
        self._i = first
        self._rotate = rotate

    async def _call(self, op: int, payload: bytes) -> None:
        c = self._clients[self._i % len(self._clients)]
        if self._rotate:
            self._i += 1
        await c.call(op, payload)

    async def put(self, value: bytes) -> None:
        await self._call(OP_PUT, value)

    async def put_batch(self, values: list[bytes]) -> None:
        await self._call(OP_PUT_MANY, encode_values(values))

    async def close(self) -> None:
        for c in self._clients:
            await c.close()


class PySyncObjSystem:
    name = "pysyncobj"
    durability = "never fsyncs (PySyncObj's in-memory journal)"
    client_kind = "asyncio TCP, length-prefixed frames pipelined on one connection, to a @replicated call"
    # Its best batch: commands of 100 x 1 KiB exceed its 64 KiB append-entries batch and stall it (a probe on
    # this machine: 16 writers x 25 values ~3,200 entries/s; x 50 or x 100, next to nothing within seconds).
    batch_size = 25
    batch_path = "one @replicated call carrying 25 values"

    def __init__(self, registry: ProcessRegistry):
        self._registry = registry
        self._members: dict[str, dict] = {}  # id -> {"raft": addr, "front": addr, "pid": int, "argv": [...]}
        self._workdir: Path | None = None
        self._status_clients: dict[str, FrontClient] = {}

    async def start(self, workdir: Path) -> None:
        import pysyncobj  # noqa: F401 (fail here, with a clear message, if it is not installed)

        self._workdir = workdir / self.name
        self._workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(6)
        raft = [f"127.0.0.1:{p}" for p in ports[:3]]
        fronts = [f"127.0.0.1:{p}" for p in ports[3:]]
        for i in range(3):
            mid = f"p{i}"
            argv = [
                sys.executable,
                "-m",
                "bench.compare.pysyncobj_group",
                "--self",
                raft[i],
                "--partners",
                ",".join(a for j, a in enumerate(raft) if j != i),
                "--front",
                fronts[i].rsplit(":", 1)[1],
            ]
            self._members[mid] = {"raft": raft[i], "front": fronts[i], "argv": argv, "pid": None}
            self._spawn(mid)
        await poll_until(self._agreed_leader, 30, "PySyncObj: one leader all members agree on")

    def _spawn(self, mid: str) -> None:
        assert self._workdir is not None
        m = self._members[mid]
        m["pid"] = self._registry.spawn(m["argv"], self._workdir / f"{mid}.log", cwd=Path.cwd()).pid

    async def _status(self, mid: str) -> dict:
        c = self._status_clients.get(mid)
        if c is None:
            c = self._status_clients[mid] = FrontClient(self._members[mid]["front"])
        return await asyncio.wait_for(c.status(), 0.5)

    async def _statuses(self) -> dict[str, dict]:
        out = {}
        for mid, m in self._members.items():
            if m["pid"] is None or not self._registry.alive(m["pid"]):
                continue
            try:
                out[mid] = await self._status(mid)
            except (FrontError, OSError, TimeoutError):
                self._status_clients.pop(mid, None)
        return out

    def _member_of(self, raft_addr: str | None) -> str | None:
        for mid, m in self._members.items():
            if m["raft"] == raft_addr:
                return mid
        return None

    async def _agreed_leader(self) -> str | None:
        sts = await self._statuses()
        leaders = {self._member_of(s["leader"]) for s in sts.values()}
        if len(sts) == len(self._members) and len(leaders) == 1 and None not in leaders:
            lead = leaders.pop()
            if sts[lead]["state"] == LEADER_STATE:
                return lead
        return None

    async def leader(self) -> LeaderView | None:
        sts = await self._statuses()
        best = None
        for mid, s in sts.items():
            if s["state"] == LEADER_STATE and (best is None or s["term"] > best.term):
                best = LeaderView(mid, s["term"])
        return best

    async def leader_pid(self) -> int | None:
        view = await self.leader()
        return self._members[view.leader]["pid"] if view else None

    async def client(self, *, failover: bool = False):
        view = await poll_until(self.leader, 15, "PySyncObj: a leader")
        fronts = [m["front"] for m in self._members.values()]
        return _PsoLoad(fronts, list(self._members).index(view.leader), rotate=failover)

    async def kill_leader(self) -> tuple[str, float]:
        view = await poll_until(self.leader, 15, "PySyncObj: a leader")
        pid = self._members[view.leader]["pid"]
        t_kill = time.monotonic()
        self._registry.kill(pid)
        self._members[view.leader]["pid"] = None
        self._status_clients.pop(view.leader, None)
        return view.leader, t_kill

    async def restart(self, member: str) -> None:
        self._spawn(member)

        async def caught_up() -> bool:
            sts = await self._statuses()
            lead = next((s for s in sts.values() if s["state"] == LEADER_STATE), None)
            mine = sts.get(member)
            return bool(
                lead and mine and mine["leader"] == lead["self"] and mine["commit_idx"] >= lead["commit_idx"]
            )

        await poll_until(caught_up, 30, f"PySyncObj: {member} caught up", interval_s=0.05)

    async def stop(self) -> None:
        for c in self._status_clients.values():
            await c.close()
        self._status_clients.clear()
        pids = [m["pid"] for m in self._members.values() if m["pid"] is not None]
        await asyncio.gather(*(asyncio.to_thread(self._registry.stop, pid) for pid in pids))
        for m in self._members.values():
            m["pid"] = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.compare.pysyncobj_group", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--self", dest="self_addr", required=True, help="this node's Raft address host:port")
    ap.add_argument("--partners", required=True, help="the other nodes' Raft addresses, comma-separated")
    ap.add_argument("--front", type=int, required=True, help="port of the load front on 127.0.0.1")
    return _node_main(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
