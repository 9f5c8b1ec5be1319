"""The broker plugin's ``[broker]`` table (broker_adapter/settings.py): checked by the plugin when the node builds
it, with the key and what is accepted; a table no part of the node reads stops the node at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_adapter.plugin import make
from broker_adapter.settings import BrokerSettings
from dledger import nodeconfig
from dledger.errors import ConfigError
from dledger.runtime.node import Node

PEERS = "n0=127.0.0.1:7001,n1=127.0.0.1:7002,n2=127.0.0.1:7003"


def config(tmp_path: Path, tables: str, state_machine: str = "broker") -> nodeconfig.NodeConfig:
    path = tmp_path / "node.toml"
    path.write_text(
        f'id = "n0"\ndata_dir = "{tmp_path / "n0"}"\npeers = "{PEERS}"\nstate_machine = "{state_machine}"\n'
        + tables
    )
    return nodeconfig.load(path)


def test_defaults_and_values(tmp_path):
    assert BrokerSettings.of(config(tmp_path, "")) == BrokerSettings()
    assert BrokerSettings().auto_create_topic_queues == 0, "off by default"
    assert BrokerSettings().max_delay_ms == 86_400_000, "RocketMQ's proxy default: 1 day"
    assert BrokerSettings().group_commit_linger_ms == 4.0
    assert (
        BrokerSettings.of(config(tmp_path, "[broker]\ngroup_commit_linger_ms = 0\n")).group_commit_linger_ms
        == 0
    )
    s = BrokerSettings.of(
        config(
            tmp_path,
            '[broker]\nauto_create_topic_queues = 8\nmax_delay_ms = 60000\nnameservers = "a:1,b:2"\n',
        )
    )
    assert (s.auto_create_topic_queues, s.max_delay_ms, s.nameservers) == (8, 60_000, ("a:1", "b:2"))


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ("auto_create = true", r"\[broker\]: unknown keys \['auto_create'\]"),
        ("auto_create_topic_queues = 5000", r"auto_create_topic_queues must be an integer in 0\.\.1024"),
        ("max_delay_ms = 10", "max_delay_ms"),
        ('cluster = "a b"', "cluster 'a b' is invalid"),
        ("retention_hours = -1", "retention_hours"),
        ('nameservers = ["nohost"]', "nameservers"),
        ("group_commit_linger_ms = 500", r"group_commit_linger_ms must be a number in 0\.\.100"),
    ],
)
def test_a_bad_value_stops_the_plugin_naming_the_key(tmp_path, table, match):
    cfg = config(tmp_path, f"[broker]\n{table}\n")
    with pytest.raises(ConfigError, match=match):
        make(cfg)


def test_a_table_no_part_of_the_node_reads_stops_it(tmp_path):
    with pytest.raises(ConfigError, match=r"\[brokr\]"):
        Node(config(tmp_path, "[brokr]\nauto_create_topic_queues = 1\n"))
    with pytest.raises(ConfigError, match=r"\[broker\]"):
        Node(config(tmp_path, "[broker]\nauto_create_topic_queues = 1\n", state_machine="kv"))
