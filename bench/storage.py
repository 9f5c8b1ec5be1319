"""Storage benchmark: FileLogStore appends, reads and opens, each against plain file I/O measured in the same run.

    python -m bench.storage                 # ~1-2 min, 256 MiB log for the read/open figures
    python -m bench.storage --size-gib 1    # the issue's 1 GiB read/open figures

Appends: 1 KiB bodies in batches of 1, 64 and 1024 entries under both flush policies. The baseline writes the
same encoded bytes in the same batches with ``os.write`` (plus one ``fdatasync`` per batch for ``sync``) to a
fresh file in the same directory. Cases alternate store and baseline and report medians of ``--reps`` runs,
because this shared VM drifts by tens of percent between passes: only ratios from one run mean anything.
Frames are encoded before timing (the Raft core encodes; the store validates and writes).

Reads: sequential ``entries()`` (decoded, body_crc checked) and ``raw()`` over the whole log, against plain
1 MiB ``pread`` of the same files. Open: a cleanly closed log, and one with a torn tail (half an entry appended
to the last data file, as a crash mid-write leaves it). Temporary files are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from storage import codec
from storage.filestore import FileLogStore
from storage.memory import MemoryLogStore

BODY = 1024
FRAME = codec.HEADER_SIZE + BODY


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    entries_per_s: float
    mb_per_s: float
    baseline_entries_per_s: float
    ratio: float
    note: str = ""
    # The same ratio per CPU-second of this process (user + system): robust to other load on a shared VM.
    cpu_ratio: float = 0.0


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t: tuple[float, float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) since ``t``."""
    return time.perf_counter() - t[0], time.process_time() - t[1]


def encode_batches(
    n_batches: int, batch: int, first_index: int = 0, segment_size: int = codec.DEFAULT_SEGMENT_SIZE
):
    """Pre-encoded batches of 1 KiB entries continuing a fresh log (positions placed as the store expects)."""
    body = (os.urandom(64) * (BODY // 64))[:BODY]
    out = []
    chain, end, index = 0, 0, first_index
    for _ in range(n_batches):
        buf = bytearray()
        for _ in range(batch):
            pos = codec.place(end, FRAME, segment_size)
            chain = codec.encode_into(buf, index, 1, pos, body, chain)
            end = pos + FRAME
            index += 1
        out.append(bytes(buf))
    return out


def time_store(
    directory: str, flush: str, batches: list[bytes], deadline_s: float
) -> tuple[int, float, float]:
    """Append batches until done or ``deadline_s``; returns (entries, wall seconds, CPU seconds)."""
    shutil.rmtree(directory, ignore_errors=True)
    store = FileLogStore.open(directory, flush=flush)
    try:
        store.append(batches[0])  # first append creates the files (index preallocation): not the steady state
        n = 0
        t0 = _now()
        limit = t0[0] + deadline_s
        for b in batches[1:]:
            store.append(b)
            n += 1
            if time.perf_counter() > limit:
                break
        if flush == "async":
            store.sync()  # the async policy's data is flushed by the periodic flusher: count one final flush
        wall, cpu = _since(t0)
        return n * (len(batches[0]) // FRAME), wall, cpu
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def time_plain(
    directory: str, flush: str, batches: list[bytes], deadline_s: float
) -> tuple[int, float, float]:
    """The baseline: os.write of the same bytes and batches (+ fdatasync per batch under sync)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    path = os.path.join(directory, "plain")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, batches[0])
        if flush == "sync":
            os.fdatasync(fd)
        n = 0
        t0 = _now()
        limit = t0[0] + deadline_s
        for b in batches[1:]:
            os.write(fd, b)
            if flush == "sync":
                os.fdatasync(fd)
            n += 1
            if time.perf_counter() > limit:
                break
        if flush == "async":
            os.fdatasync(fd)
        wall, cpu = _since(t0)
        return n * (len(batches[0]) // FRAME), wall, cpu
    finally:
        os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


def median_rates(fn: Callable[[], tuple[int, float, float]], reps: int) -> tuple[float, float]:
    """Median entries per wall second and per CPU second over ``reps`` runs."""
    runs = [fn() for _ in range(reps)]
    return statistics.median(n / w for n, w, _ in runs), statistics.median(
        n / max(c, 1e-9) for n, _, c in runs
    )


def bench_appends(work: str, reps: int, quick: bool) -> list[Row]:
    rows = []
    # (policy, batch, entries per run, seconds cap per run): sized so each run lasts about a second.
    cases = [
        ("sync", 1, 4_000, 1.0),
        ("sync", 64, 64 * 400, 1.0),
        ("sync", 1024, 1024 * 80, 1.5),
        ("async", 1, 100_000, 1.0),
        ("async", 64, 64 * 2_000, 1.0),
        ("async", 1024, 1024 * 160, 1.5),
    ]
    for flush, batch, entries, cap in cases:
        if quick:
            entries, cap = max(batch * 4, entries // 8), cap / 4
        batches = encode_batches(entries // batch + 1, batch)
        store_rates, plain_rates, store_cpu, plain_cpu = [], [], [], []
        for _ in range(reps):  # alternate, so drift hits both sides alike
            n, wall, cpu = time_plain(os.path.join(work, "plain"), flush, batches, cap)
            plain_rates.append(n / wall)
            plain_cpu.append(n / cpu)
            n, wall, cpu = time_store(os.path.join(work, "store"), flush, batches, cap)
            store_rates.append(n / wall)
            store_cpu.append(n / cpu)
        s, p = statistics.median(store_rates), statistics.median(plain_rates)
        cpu_ratio = statistics.median(store_cpu) / statistics.median(plain_cpu) if flush == "async" else 0.0
        rows.append(Row(f"append {flush:5} batch {batch:4}", s, s * FRAME / 1e6, p, s / p, "", cpu_ratio))
        print(_fmt(rows[-1]), flush=True)
    return rows


def bench_memory(reps: int, quick: bool) -> list[Row]:
    """MemoryLogStore (the simulator's log) appends, against appending the same bytes to a bytearray."""
    rows = []
    for batch in (1, 64, 1024):
        entries = (20_000 if batch == 1 else 200_000) // (8 if quick else 1)
        batches = encode_batches(entries // batch, batch)

        def store_run(batches: list[bytes] = batches, batch: int = batch) -> tuple[int, float, float]:
            store = MemoryLogStore()
            t = _now()
            for b in batches:
                store.append(b)
            return (len(batches) * batch, *_since(t))

        def plain_run(batches: list[bytes] = batches, batch: int = batch) -> tuple[int, float, float]:
            buf = bytearray()
            t = _now()
            for b in batches:
                buf += b
            return (len(batches) * batch, *_since(t))

        s, s_cpu = median_rates(store_run, reps)
        p, p_cpu = median_rates(plain_run, reps)
        rows.append(
            Row(
                f"memory append batch {batch:4}",
                s,
                s * FRAME / 1e6,
                p,
                s / p,
                "vs bytearray +=",
                s_cpu / p_cpu,
            )
        )
        print(_fmt(rows[-1]), flush=True)
    return rows


def build_log(directory: str, size_bytes: int) -> int:
    """A log of ~size_bytes of 1 KiB entries (async appends of 1024, then one sync); returns the entry count."""
    store = FileLogStore.open(directory, flush="async")
    body = (os.urandom(64) * (BODY // 64))[:BODY]
    total = size_bytes // FRAME
    try:
        done = 0
        while done < total:
            t = store.tail()
            n = min(1024, total - done)
            buf = bytearray()
            chain, end = t.chain_crc, t.end_pos
            for k in range(n):
                pos = codec.place(end, FRAME, store.segment_size)
                chain = codec.encode_into(buf, t.last_index + 1 + k, 1, pos, body, chain)
                end = pos + FRAME
            store.append(buf)
            done += n
        store.sync()
    finally:
        store.close()
    return total


def bench_reads_and_open(work: str, size_bytes: int, reps: int) -> list[Row]:
    rows = []
    d = os.path.join(work, "log")
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    total = build_log(d, size_bytes)
    print(
        f"# built a {size_bytes / 2**20:.0f} MiB log of {total} entries in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    def plain_read() -> tuple[int, float, float]:
        t = _now()
        nbytes = 0
        data_dir = os.path.join(d, "data")
        for name in sorted(n for n in os.listdir(data_dir) if n.isdigit()):
            fd = os.open(os.path.join(data_dir, name), os.O_RDONLY)
            try:
                off = 0
                while True:
                    chunk = os.pread(fd, 1 << 20, off)
                    if not chunk:
                        break
                    off += len(chunk)
                    nbytes += len(chunk)
            finally:
                os.close(fd)
        return (nbytes // FRAME, *_since(t))

    store = FileLogStore.open(d)
    try:

        def read_entries() -> tuple[int, float, float]:
            t = _now()
            n = 0
            for lo in range(0, total, 1024):
                n += len(store.entries(lo, min(total, lo + 1024)))
            return (n, *_since(t))

        def read_raw() -> tuple[int, float, float]:
            t = _now()
            nbytes = 0
            for lo in range(0, total, 1024):
                nbytes += len(store.raw(lo, min(total, lo + 1024)))
            return (nbytes // FRAME, *_since(t))

        def read_terms() -> tuple[int, float, float]:
            t = _now()
            for i in range(total):
                store.term(i)
            return (total, *_since(t))

        p, p_cpu = median_rates(plain_read, reps)
        for name, fn, note in (
            ("read entries() x1024", read_entries, "decoded, body_crc checked"),
            ("read raw() x1024", read_raw, "bytes for replication"),
            ("term(i) every index", read_terms, "index lookups"),
        ):
            s, s_cpu = median_rates(fn, reps)
            rows.append(Row(name, s, s * FRAME / 1e6, p, s / p, f"{note}; {s_cpu:,.0f}/CPU-s", s_cpu / p_cpu))
            print(_fmt(rows[-1]), flush=True)
    finally:
        store.close()

    opens = []
    for _ in range(reps):
        t = time.perf_counter()
        s = FileLogStore.open(d)
        opens.append(time.perf_counter() - t)
        assert s.last_index == total - 1
        s.close()
    clean = statistics.median(opens)
    rows.append(
        Row("open, clean", 1 / clean, 0, 0, 0, f"{clean * 1000:.0f} ms for {size_bytes / 2**30:.2f} GiB")
    )
    print(_fmt(rows[-1]), flush=True)

    torn = []
    data_dir = os.path.join(d, "data")
    last = os.path.join(data_dir, sorted(n for n in os.listdir(data_dir) if n.isdigit())[-1])
    for _ in range(reps):
        with open(last, "ab") as f:  # half an entry: what a crash in the middle of a write leaves
            f.write(encode_batches(1, 1)[0][: FRAME // 2])
        t = time.perf_counter()
        s = FileLogStore.open(d)
        torn.append(time.perf_counter() - t)
        assert s.last_index == total - 1 and s.recovery.torn_bytes > 0
        s.close()
    dt = statistics.median(torn)
    rows.append(Row("open, torn tail", 1 / dt, 0, 0, 0, f"{dt * 1000:.0f} ms, tail truncated"))
    print(_fmt(rows[-1]), flush=True)
    shutil.rmtree(d, ignore_errors=True)
    return rows


def _fmt(r: Row) -> str:
    if r.baseline_entries_per_s:
        cpu = f"cpu ratio {r.cpu_ratio:5.2f}" if r.cpu_ratio else " " * 15
        return (
            f"{r.case:28} {r.entries_per_s:12,.0f} entries/s {r.mb_per_s:8,.1f} MB/s   plain "
            f"{r.baseline_entries_per_s:12,.0f}/s   ratio {r.ratio:5.2f}  {cpu}  {r.note}"
        )
    return f"{r.case:28} {r.note}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--size-gib", type=float, default=0.25, help="log size for read/open figures (default 0.25)"
    )
    ap.add_argument("--reps", type=int, default=3, help="runs per case; medians are reported (default 3)")
    ap.add_argument("--dir", default=None, help="where to put temporary files (default: a new temp dir)")
    ap.add_argument("--quick", action="store_true", help="tiny runs (a smoke test of the benchmark itself)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir)
    try:
        print(f"# FileLogStore vs plain file I/O, 1 KiB bodies ({FRAME}-byte frames), medians of {args.reps}")
        rows = bench_appends(work, args.reps, args.quick)
        rows += bench_memory(args.reps, args.quick)
        size = int((0.01 if args.quick else args.size_gib) * 2**30)
        rows += bench_reads_and_open(work, size, args.reps)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(r) for r in rows], f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
