"""A fault-injecting TCP proxy between the nodes of a local group, on 127.0.0.1 only.

Every ordered pair of nodes (i, j) gets its own ``Link``: node i's config names the link's port as j's address,
and the link forwards to j's real port. Node i's gRPC channel to j (its pipe, votes, snapshot streams) is one
TCP connection through that link, so the link sees two byte streams: ``fwd`` (i's requests to j) and ``bwd``
(j's answers to i). A Raft message from i to j therefore travels either on link(i->j).fwd (a request) or on
link(j->i).bwd (an answer to j's request), and ``Network`` controls both together when it cuts, slows or
disturbs "messages from i to j".

What the controls mean on a TCP stream (gRPC over HTTP/2 multiplexes everything between two nodes on one
connection, so single messages cannot be dropped without corrupting the stream):

- **blocked**: the direction's bytes are read and discarded, as a partition swallows packets. Connections
  still open (a SYN would be lost too, but then the client would see its own timeout, which is what it sees
  now). A connection that lost bytes is closed when the direction is unblocked, so the peers reconnect with a
  clean HTTP/2 stream, as they would after a partition long enough to time the connection out.
- **delay_s**: every chunk is forwarded ``delay_s`` after it was read, in order (added one-way latency).
- **reset_probability**: each chunk, with this probability, resets the whole connection instead of being
  forwarded ("loss": on a real network a lost segment stalls a stream until retransmission; here the stream
  breaks and gRPC reconnects, which is harsher and exercises the same retry paths).

The proxy runs on its own event loop in a daemon thread (``Network.start``); the control methods are
thread-safe and return once the change is in effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger("dledger.chaos.proxy")

CHUNK = 1 << 16


@dataclass(slots=True)
class Direction:
    """The controls of one byte direction of a link."""

    blocked: bool = False
    delay_s: float = 0.0
    reset_probability: float = 0.0

    def clear(self) -> None:
        self.blocked = False
        self.delay_s = 0.0
        self.reset_probability = 0.0


@dataclass(eq=False, slots=True)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tainted: bool = False  # lost bytes while blocked: must be closed once unblocked
    tasks: list[asyncio.Task] = field(default_factory=list)

    def close(self) -> None:
        for w in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                transport = w.transport
                if transport is not None:
                    transport.abort()  # RST, not an orderly FIN: the peer must notice at once
        for t in self.tasks:
            t.cancel()


@dataclass(frozen=True, slots=True)
class LinkSpec:
    src: str
    dst: str
    port: int  # the proxy listens on 127.0.0.1:port
    target: str  # dst's real address, host:port


class Link:
    """The proxy for one ordered node pair: src connects to ``port``, bytes go on to dst's real port."""

    def __init__(self, spec: LinkSpec, rng: random.Random):
        self.spec = spec
        self.fwd = Direction()
        self.bwd = Direction()
        self._rng = rng
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Conn] = set()
        self.bytes_forwarded = 0
        self.bytes_discarded = 0
        self.resets = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.spec.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.close()
        self._conns.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def close_tainted(self) -> int:
        n = 0
        for c in list(self._conns):
            if c.tainted:
                c.close()
                self._conns.discard(c)
                n += 1
        return n

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, _, port = self.spec.target.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.transport.abort()  # the destination is down: the source sees a refused connection
            return
        conn = _Conn(writer, up_writer)
        self._conns.add(conn)
        conn.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, self.fwd, conn)),
            asyncio.create_task(self._pump(up_reader, writer, self.bwd, conn)),
        ]

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, d: Direction, conn: _Conn
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                item = await queue.get()
                if item is None:
                    return
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)  # the injected latency itself, not a wait for a condition
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if d.blocked:
                    conn.tainted = True
                    self.bytes_discarded += len(data)
                    continue
                if d.reset_probability and self._rng.random() < d.reset_probability:
                    self.resets += 1
                    break
                self.bytes_forwarded += len(data)
                queue.put_nowait((loop.time() + d.delay_s, data))
            queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # either side went away: the connection ends below
        finally:
            sender.cancel()
            conn.close()
            self._conns.discard(conn)


class Network:
    """Every link of a group, on one event loop in a background thread, with message-level controls."""

    def __init__(self, links: Iterable[LinkSpec], seed: int = 0):
        self._rng = random.Random(seed)
        self.links: dict[tuple[str, str], Link] = {(s.src, s.dst): Link(s, self._rng) for s in links}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def nodes(self) -> list[str]:
        return sorted({a for a, _ in self.links} | {b for _, b in self.links})

    def start(self) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop

            async def start_all() -> None:
                await asyncio.gather(*(lk.start() for lk in self.links.values()))

            try:
                loop.run_until_complete(start_all())
            except BaseException as e:
                errors.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()

            async def stop_all() -> None:
                await asyncio.gather(*(lk.stop() for lk in self.links.values()))

            loop.run_until_complete(stop_all())
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10.0):
            raise RuntimeError("the proxy did not start within 10 s")
        if errors:
            raise RuntimeError(f"the proxy could not listen: {errors[0]}") from errors[0]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
        self._loop = None

    def __enter__(self) -> Network:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_links(self, links: Iterable[LinkSpec]) -> None:
        """Listen on the links of a node that joined the group (``dledger.group_members.add_member`` gives a new
        member of a proxied group its links); returns once they listen."""
        new = [Link(s, self._rng) for s in links if (s.src, s.dst) not in self.links]
        if self._loop is None:
            self.links.update({(lk.spec.src, lk.spec.dst): lk for lk in new})
            return

        async def start_all() -> None:
            await asyncio.gather(*(lk.start() for lk in new))
            self.links.update({(lk.spec.src, lk.spec.dst): lk for lk in new})

        asyncio.run_coroutine_threadsafe(start_all(), self._loop).result(10.0)

    def _run(self, fn, *args) -> None:
        """Run ``fn`` on the proxy loop and wait for it: a change is in effect when this returns."""
        if self._loop is None:
            fn(*args)
            return
        done = threading.Event()
        failed: list[BaseException] = []

        def call() -> None:
            try:
                fn(*args)
            except BaseException as e:
                failed.append(e)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(call)
        if not done.wait(10.0):
            raise RuntimeError("the proxy loop did not answer within 10 s")
        if failed:
            raise failed[0]

    # -- message-level controls (src, dst are node ids) ---------------------------------------------------------

    def _directions(self, src: str, dst: str) -> list[Direction]:
        """The byte directions that carry messages from src to dst."""
        out = []
        if (src, dst) in self.links:
            out.append(self.links[(src, dst)].fwd)
        if (dst, src) in self.links:
            out.append(self.links[(dst, src)].bwd)
        if not out:
            raise KeyError(f"no link between {src} and {dst}")
        return out

    def block(self, src: str, dst: str) -> None:
        """Messages from src to dst are lost (one way)."""

        def apply() -> None:
            for d in self._directions(src, dst):
                d.blocked = True

        self._run(apply)

    def partition(self, sides: Iterable[Iterable[str]]) -> list[tuple[str, str]]:
        """Cut every pair of nodes that are not on a common side (a node may be on several: a bridge).
        Returns the directed pairs cut."""
        sides = [set(s) for s in sides]
        cut = [
            (a, b)
            for a in self.nodes
            for b in self.nodes
            if a != b
            and not any(a in s and b in s for s in sides)
            and ((a, b) in self.links or (b, a) in self.links)  # a member gone before the other joined: none
        ]
        self.cut_pairs(cut)
        return cut

    def cut_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        pairs = list(pairs)

        def apply() -> None:
            for a, b in pairs:
                for d in self._directions(a, b):
                    d.blocked = True

        self._run(apply)

    def delay(self, src: str, dst: str, delay_s: float) -> None:
        def apply() -> None:
            for d in self._directions(src, dst):
                d.delay_s = delay_s

        self._run(apply)

    def loss(self, src: str, dst: str, probability: float) -> None:
        def apply() -> None:
            for d in self._directions(src, dst):
                d.reset_probability = probability

        self._run(apply)

    def heal(self) -> None:
        """Clear every control and close connections that lost bytes while blocked."""

        def apply() -> None:
            for lk in self.links.values():
                lk.fwd.clear()
                lk.bwd.clear()
            for lk in self.links.values():
                lk.close_tainted()

        self._run(apply)

    def stats(self) -> dict[str, int]:
        return {
            "bytes_forwarded": sum(lk.bytes_forwarded for lk in self.links.values()),
            "bytes_discarded": sum(lk.bytes_discarded for lk in self.links.values()),
            "resets": sum(lk.resets for lk in self.links.values()),
        }
