"""The ``dledger`` source and sink on a real three-node group, with real Spark (local mode; issue 29).

One group and one Spark session serve the module (each costs seconds); every test uses its own topics.
"""

from __future__ import annotations

import json

import pytest

from broker_adapter.client import BrokerConnection, Producer
from dledger import group as grp

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    g, _ = grp.up(tmp_path_factory.mktemp("dsgroup"), 3, None, state_machine="broker")
    try:
        yield g
    finally:
        grp.stop_group(g)


@pytest.fixture(scope="module")
def ds(spark):
    from spark.datasource import register

    register(spark)
    return spark


def topic(g: grp.GroupSpec, name: str, queues: int = 3) -> str:
    with BrokerConnection(g.addresses) as c:
        c.create_topic(name, queues)
    return name


def produce(g: grp.GroupSpec, name: str, n: int, **kw) -> list:
    with Producer(g.addresses, retry_for_s=60) as p:
        out = []
        for i in range(0, n, 50):
            out += p.send_batch(
                name, [(f"m{k}".encode(), f"t{k % 2}", [f"k{k}"]) for k in range(i, min(n, i + 50))]
            )
        return out


def reader(ds, g: grp.GroupSpec, name: str, **opts):
    r = ds.read.format("dledger").option("addresses", ",".join(g.addresses)).option("topic", name)
    for k, v in opts.items():
        r = r.option(k, v)
    return r


def test_batch_read_every_queue_with_its_columns(ds, group):
    name = topic(group, "batch", 3)
    acked = produce(group, name, 300)
    df = reader(ds, group, name).load()
    assert df.rdd.getNumPartitions() == 3  # one per queue range
    rows = df.collect()
    assert sorted(r.msg_id for r in rows) == sorted(a.msg_id for a in acked)
    by_id = {r.msg_id: r for r in rows}
    for a in acked:
        r = by_id[a.msg_id]
        assert (r.group, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset) == (
            "default",
            name,
            a.queue_id,
            a.queue_offset,
            a.commitlog_offset,
        )
    r = by_id[acked[7].msg_id]
    assert (bytes(r.body), r.tags, r.keys, r.properties) == (b"m7", "t1", ["k7"], {})
    assert r.store_timestamp >= r.born_timestamp
    # per-queue JSON and latest: queue 0 from offset 5 to its end, queue 1 nothing, queue 2 up to 10
    ends = {q: sum(1 for a in acked if a.queue_id == q) for q in range(3)}
    start = json.dumps({name: {"0": 5, "1": -1, "2": -2}})
    end = json.dumps({name: {"2": 10}})
    got = reader(ds, group, name, startingOffsets=start, endingOffsets=end).load().collect()
    per = {q: sorted(r.queue_offset for r in got if r.queue_id == q) for q in range(3)}
    assert per == {0: list(range(5, ends[0])), 1: [], 2: list(range(10))}
    # a timestamp: from the first message stored at or after it
    mid = sorted(rows, key=lambda r: (r.store_timestamp, r.commitlog_offset))[150].store_timestamp
    ms = int(mid.timestamp() * 1000)
    later = reader(ds, group, name, startingTimestamp=str(ms)).load().collect()
    assert {r.msg_id for r in later} == {
        r.msg_id for r in rows if int(r.store_timestamp.timestamp() * 1000) >= ms
    }


@pytest.fixture(scope="module")
def bad_topic(group):
    return topic(group, "badopts", 1)


@pytest.mark.parametrize(
    ("opts", "named"),
    [
        ({"startingOffsets": "{not json"}, "startingOffsets"),
        ({"startingOffsets": '{"nosuch": {"0": 1}}'}, "startingOffsets"),
        ({"startingOffsets": '{"badopts": {"0": 99}}'}, "startingOffsets"),
        ({"bogus": "1"}, "bogus"),
        ({"pullBatch": "0"}, "pullBatch"),
        ({"topic": "does-not-exist"}, "topic"),
    ],
)
def test_bad_options_fail_when_planned_naming_the_option(ds, group, bad_topic, opts, named):
    r = reader(ds, group, bad_topic, **opts)
    with pytest.raises(Exception, match=named):
        r.load().collect()
