"""Concurrent callers share calls: what arrives while calls are in flight goes out together, each caller gets
its own results, and a call refused because of one caller's items is re-made per caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dledger.combiner import AsyncCombiner, Combiner
from dledger.errors import InvalidRequestError, OutcomeUnknownError


class Recorder:
    """A call that blocks its first invocation until released, so the others queue behind it."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, items: list[str]) -> list[str]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if "bad" in items:
            raise InvalidRequestError("bad item")
        if "lost" in items:
            raise OutcomeUnknownError("connection broke")
        return [x.upper() for x in items]


def _run_threads(combiner, inputs):
    results: dict[int, object] = {}

    def one(i, items):
        try:
            results[i] = combiner.submit(items)
        except Exception as e:  # the test inspects it
            results[i] = e

    threads = [threading.Thread(target=one, args=(i, items)) for i, items in enumerate(inputs)]
    return threads, results


def test_callers_queued_behind_a_call_share_the_next_one():
    rec = Recorder()
    c = Combiner(rec, max_inflight=1)
    threads, results = _run_threads(c, [["a"], ["b", "c"], ["d"], ["e"]])
    threads[0].start()
    assert rec.entered.wait(10)
    for t in threads[1:]:
        t.start()
    while len(c._queue) < 3:  # every other caller is waiting
        threading.Event().wait(0.001)
    rec.release.set()
    for t in threads:
        t.join(10)
    assert rec.calls == [["a"], ["b", "c", "d", "e"]]
    assert results == {0: ["A"], 1: ["B", "C"], 2: ["D"], 3: ["E"]}


def test_a_bad_caller_fails_alone_and_an_unknown_outcome_fails_all():
    rec = Recorder()
    c = Combiner(rec, max_inflight=1)
    threads, results = _run_threads(c, [["a"], ["b"], ["bad"], ["c"]])
    threads[0].start()
    assert rec.entered.wait(10)
    for t in threads[1:]:
        t.start()
    while len(c._queue) < 3:
        threading.Event().wait(0.001)
    rec.release.set()
    for t in threads:
        t.join(10)
    assert results[1] == ["B"] and results[3] == ["C"]
    assert isinstance(results[2], InvalidRequestError)
    assert ["b", "bad", "c"] in rec.calls and ["bad"] in rec.calls

    rec2 = Recorder()
    rec2.release.set()
    c2 = Combiner(rec2)
    with pytest.raises(OutcomeUnknownError):
        c2.submit(["lost", "x"])


def test_many_threads_every_result_once():
    c = Combiner(lambda items: [x * 2 for x in items], max_inflight=2, max_items=5)
    out: list[list[int]] = [[] for _ in range(16)]

    def worker(k):
        for i in range(50):
            out[k].append(c.submit([k * 1000 + i])[0])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == [[2 * (k * 1000 + i) for i in range(50)] for k in range(16)]
    assert c._inflight == 0 and not c._queue


def test_async_callers_share_calls():
    async def main():
        calls: list[list[int]] = []
        gate = asyncio.Event()

        async def call(items):
            calls.append(list(items))
            await gate.wait()
            if -1 in items:
                raise InvalidRequestError("negative")
            return [x + 1 for x in items]

        c = AsyncCombiner(call, max_inflight=1)
        tasks = [asyncio.create_task(c.submit([0]))]
        while not calls:  # the first call is in flight: the others queue behind it
            await asyncio.sleep(0)
        tasks += [asyncio.create_task(c.submit([i])) for i in range(1, 5)]
        tasks.append(asyncio.create_task(c.submit([-1])))
        await asyncio.sleep(0.01)
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[:5] == [[1], [2], [3], [4], [5]]
        assert isinstance(results[5], InvalidRequestError)
        assert calls[0] == [0] and calls[1] == [1, 2, 3, 4, -1]

    asyncio.run(main())


def test_callers_just_answered_are_gathered_into_the_next_call():
    # Eight threads in a closed loop: after a call that carried all eight, the next call waits (bounded) for
    # them to come back instead of leaving with the first one or two to be woken.
    calls: list[int] = []
    first = threading.Event()

    def call(items):
        calls.append(len(items))
        if len(calls) == 1:
            assert first.wait(10)
        else:
            threading.Event().wait(0.4)  # a call's length bounds the next one's gather (a quarter of it)
        return items

    c = Combiner(call, max_gather_s=5.0)
    start = threading.Barrier(8)

    def worker(k):
        start.wait()
        for i in range(2):
            assert c.submit([k * 10 + i]) == [k * 10 + i]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    while len(c._queue) < 7:  # one caller is in the first call, seven wait
        threading.Event().wait(0.001)
    first.set()
    for t in threads:
        t.join(10)
    # The first call carried one caller, the second the seven queued (or eight, if the first was already back):
    # everything left goes in one more call, however the threads are woken.
    assert calls[0] == 1 and calls[1] in (7, 8) and sum(calls) == 16
    assert len(calls) == 3


def test_a_lone_caller_and_callers_that_do_not_come_back_never_wait_long():
    # A huge gather bound must not delay a sequential caller (it never waits) and is cut by the last call's
    # duration when callers leave: 200 sequential calls after an 8-caller call finish well inside the join.
    c = Combiner(lambda items: items, max_gather_s=60.0)
    for i in range(200):
        assert c.submit([i]) == [i]
    threads, results = _run_threads(c, [[k] for k in range(8)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(r[0] for r in results.values()) == list(range(8))
    done = threading.Event()

    def alone():
        for i in range(50):
            c.submit([i])
        done.set()

    threading.Thread(target=alone).start()
    assert done.wait(30)
