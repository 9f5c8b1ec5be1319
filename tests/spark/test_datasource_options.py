"""The dledger source's options and micro-batch limits, without Spark or a group (issue 29)."""

from __future__ import annotations

import pytest

from spark.datasource.options import OptionError, read_options, write_options
from spark.datasource.source import _limited

GROUP = {"addresses": "127.0.0.1:1,127.0.0.1:2", "topic": "t"}


def test_options_parse_and_name_what_is_wrong():
    o = read_options(
        {**GROUP, "STARTINGOFFSETS": '{"t": {"0": 5, "g/1": -2}}', "maxOffsetsPerTrigger": "10"}, True
    )
    assert o.starting.offsets == {"t": {"0": 5, "g/1": -2}} and o.max_per_trigger == 10
    assert (
        o.ending.kind == "latest"
        and o.fail_on_data_loss
        and o.connect.addresses == ("127.0.0.1:1", "127.0.0.1:2")
    )
    assert (
        read_options({**GROUP, "startingTimestamp": "1700000000000"}, False).starting.timestamp_ms
        == 1700000000000
    )
    bad = [
        ({"topic": "t"}, "option addresses"),
        ({**GROUP, "nameservers": "127.0.0.1:3"}, "option addresses"),
        ({**GROUP, "addresses": "nohost"}, "option addresses"),
        ({**GROUP, "topic": ""}, "option topic"),
        ({**GROUP, "startingOffsets": "[1]"}, "option startingOffsets"),
        ({**GROUP, "startingOffsets": '{"t": {"x": 1}}'}, "option startingOffsets"),
        ({**GROUP, "startingOffsets": '{"t": {"0": -3}}'}, "option startingOffsets"),
        ({**GROUP, "startingOffsets": '{"u": {"0": 1}}'}, "option startingOffsets"),
        ({**GROUP, "startingOffsets": "latest", "startingTimestamp": "1"}, "option startingTimestamp"),
        ({**GROUP, "endingOffsets": "earliest"}, "option endingOffsets"),
        ({**GROUP, "failOnDataLoss": "maybe"}, "option failOnDataLoss"),
        ({**GROUP, "maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger"),
        ({**GROUP, "accessKey": "a"}, "option accessKey"),
        ({**GROUP, "caFile": "/nonexistent.pem"}, "option caFile"),
        ({**GROUP, "timeoutMs": "soon"}, "option timeoutMs"),
        ({**GROUP, "nosuch": "1"}, "'nosuch'"),
    ]
    for opts, named in bad:
        with pytest.raises(OptionError, match=named):
            read_options(opts, streaming=False)
    with pytest.raises(OptionError, match="option endingOffsets"):
        read_options({**GROUP, "endingOffsets": "latest"}, streaming=True)
    assert write_options({**GROUP, "checkpointLocation": "/x", "batchSize": "8"}).batch_size == 8
    with pytest.raises(OptionError, match="option topic"):
        write_options({**GROUP, "topic": "a,b"})


def test_max_offsets_per_trigger_is_shared_in_proportion_and_never_exceeded():
    start = {"g": {"t": {"0": 0, "1": 100, "2": 50}}}
    latest = {"g": {"t": {"0": 300, "1": 200, "2": 50, "3": 40}}}  # queue 3 is new
    out = _limited(start, latest, 100)
    took = {q: out["g"]["t"].get(q, 0) - start["g"]["t"].get(q, 0) for q in ("0", "1", "2", "3")}
    assert sum(took.values()) == 100
    assert took["0"] > took["1"] > took["3"] > 0 and took["2"] == 0
    assert all(out["g"]["t"][q] <= latest["g"]["t"][q] for q in out["g"]["t"])
    assert _limited(start, latest, 10_000) == latest  # under the limit: everything
    one = _limited(start, latest, 1)
    assert sum(one["g"]["t"].get(q, 0) - start["g"]["t"].get(q, 0) for q in ("0", "1", "2", "3")) == 1
