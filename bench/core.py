"""Benchmark: committed entries/s through a 3-node Raft cluster in one process (the protocol's CPU cost).

Three ``RaftCore``s exchange messages through an in-process queue; each node's runtime duty (persist the Ready to
a ``MemoryLogStore``, send, advance) is done inline. A client keeps proposing batches of 1 KiB bodies (1 or 256
bodies per ``propose`` call) while at most ``--window`` entries are uncommitted. No I/O, no threads: this is the
ceiling the Raft core puts on everything above it.

Printed next to the baseline measured in the same run: just encoding the same entries with
``storage.codec.encode_into`` (one CRC of the body, one header pack; ../shared/anchors: about 1 µs per entry).
Two store variants: the real ``MemoryLogStore`` (validates every appended frame: structure, body CRC, chain,
positions: three times per entry, once per node) and ``TrustingStore`` (skips the validation, isolating the core).

    python -m bench.core [--entries N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time
from collections import deque

from dledger.core.config import RaftConfig
from dledger.core.messages import Role
from dledger.core.raft import RaftCore
from storage import codec
from storage.api import HardState
from storage.memory import MemoryLogStore

BODY = bytes(range(256)) * 4  # 1 KiB
IDS = ["n1", "n2", "n3"]


class TrustingStore(MemoryLogStore):
    """A MemoryLogStore that trusts frames (they were built by our own cores): appends without validating."""

    def append(self, frames):
        t = self.tail()
        first = t.last_index + 1
        mv = memoryview(frames)
        unpack = codec.HEADER.unpack_from
        start = self._base + len(self._buf)
        off = 0
        end = len(mv)
        offs, poss, sizes, terms, chains = self._off, self._pos, self._size, self._term, self._chain
        out = []
        while off < end:
            _m, size, index, term, pos, _c, chain, _b, _l = unpack(mv, off)
            if index != first + len(out):
                raise codec.FrameError(f"index {index}, expected {first + len(out)}", off, index)
            offs.append(start + off)
            poss.append(pos)
            sizes.append(size)
            terms.append(term)
            chains.append(chain)
            out.append(pos)
            off += size
        self._buf += frames
        return out


class Bench:
    def __init__(self, store_cls, config: RaftConfig):
        self.stores = {i: store_cls(config.segment_size) for i in IDS}
        self.cores = {
            i: RaftCore(
                i, IDS, self.stores[i], HardState(), config, random.Random(k), log_event=lambda s: None
            )
            for k, i in enumerate(IDS)
        }
        self.queue: deque = deque()
        self.store_secs = 0.0  # time inside store appends (the runtime's persistence work)
        self.leader = self._elect()

    def _process(self, core: RaftCore) -> None:
        store = self.stores[core.id]
        clock = time.perf_counter
        while core.has_ready():
            rd = core.ready()
            t = clock()
            if rd.truncate_from is not None:
                store.truncate_suffix(rd.truncate_from)
            if rd.frames:
                store.append(rd.frames)
            self.store_secs += clock() - t
            self.queue.extend(rd.messages)
            core.advance(rd)

    def _pump(self) -> None:
        cores = self.cores
        q = self.queue
        for c in cores.values():
            self._process(c)
        while q:
            m = q.popleft()
            c = cores[m.dst]
            c.step(m)
            self._process(c)

    def _elect(self) -> RaftCore:
        for _ in range(1000):
            for c in self.cores.values():
                c.tick()
            self._pump()
            for c in self.cores.values():
                if c.role is Role.LEADER:
                    self._pump()
                    return c
        raise RuntimeError("no leader elected")

    def run(self, total: int, batch: int, window: int) -> tuple[float, float]:
        """Propose ``total`` entries in batches; returns (seconds until the leader committed them all, of which
        seconds spent in store appends)."""
        leader = self.leader
        bodies = [BODY] * batch
        start_commit = leader.commit_index
        target = start_commit + total
        proposed = 0
        q = self.queue
        cores = self.cores
        process = self._process
        self.store_secs = 0.0
        t0 = time.perf_counter()
        while leader.commit_index < target:
            # Keep up to `window` entries uncommitted: proposals arrive while earlier ones replicate.
            while proposed < total and leader.last_index - leader.commit_index < window:
                leader.propose(bodies)
                proposed += batch
            process(leader)
            # One network round: deliver what is queued now; replies go to the back of the queue.
            for _ in range(len(q)):
                m = q.popleft()
                c = cores[m.dst]
                c.step(m)
                process(c)
        return time.perf_counter() - t0, self.store_secs


def encode_baseline(total: int, segment_size: int) -> float:
    buf = bytearray()
    t0 = time.perf_counter()
    chain = 0
    pos = 0
    place = codec.place
    for i in range(total):
        if len(buf) > (64 << 20):
            buf = bytearray()
        size = codec.HEADER_SIZE + len(BODY)
        pos = place(pos, size, segment_size)
        chain = codec.encode_into(buf, i, 1, pos, BODY, chain)
        pos += size
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000, help="entries per measurement (batch 256)")
    ap.add_argument("--entries-batch1", type=int, default=50_000, help="entries per measurement (batch 1)")
    ap.add_argument(
        "--window", type=int, default=4096, help="max uncommitted entries the client keeps in flight"
    )
    ap.add_argument(
        "--profile", action="store_true", help="cProfile the batch-256 run and print the top functions"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="best of N runs for both figures (the machine is shared)"
    )
    args = ap.parse_args()
    config = RaftConfig()
    print(
        f"3-node in-process cluster, 1 KiB bodies, max_append_bytes={config.max_append_bytes}, "
        f"max_inflight={config.max_inflight}, client window {args.window} entries"
    )
    print(
        f"{'store':<16}{'batch':>6}{'entries':>10}{'entries/s':>12}{'core-only/s':>14}{'encode-only/s':>15}"
        f"{'ratio':>8}{'core':>8}{'target':>10}"
    )
    for store_cls in (MemoryLogStore, TrustingStore):
        for batch, total, target in ((256, args.entries, 500_000), (1, args.entries_batch1, 50_000)):
            total -= total % batch
            window = max(args.window, batch)
            if args.profile and batch == 256:
                b = Bench(store_cls, config)
                prof = cProfile.Profile()
                prof.enable()
                b.run(total, batch, window)
                prof.disable()
            secs = base = core_secs = float("inf")
            for _ in range(args.repeat):  # alternate the two so both see the same machine load
                run_secs, store_secs = Bench(store_cls, config).run(total, batch, window)
                secs = min(secs, run_secs)
                core_secs = min(core_secs, run_secs - store_secs)
                base = min(base, encode_baseline(total, config.segment_size))
            rate = total / secs
            base_rate = total / base
            core_rate = total / core_secs
            print(
                f"{store_cls.__name__:<16}{batch:>6}{total:>10}{rate:>12,.0f}{core_rate:>14,.0f}{base_rate:>15,.0f}"
                f"{rate / base_rate:>8.2f}{core_rate / base_rate:>8.2f}{rate / target:>9.2f}x"
            )
            if args.profile and batch == 256:
                pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    print(
        "entries/s: committed by the leader per wall second (cores + stores + this loop); core-only/s: the same "
        "entries per second of everything but the store appends (the runtime's persistence); ratio and core: "
        "those divided by encode-only entries/s measured in this run; target: entries/s divided by the issue's "
        "target (500k at batch 256, 50k at batch 1)"
    )


if __name__ == "__main__":
    main()
