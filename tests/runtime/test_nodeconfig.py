"""Config from TOML and flags: good settings load, bad ones fail at start with a message naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger import nodeconfig
from dledger.errors import ConfigError

PEERS = "n0=127.0.0.1:20911,n1=127.0.0.1:20912,n2=127.0.0.1:20913"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "node.toml"
    p.write_text(text)
    return p


def test_toml_file_loads(tmp_path):
    p = write(
        tmp_path,
        """
id = "n1"
group = "orders"
data_dir = "var/n1"
flush = "async"
flush_interval_ms = 20
[peers]
n0 = "127.0.0.1:20911"
n1 = "127.0.0.1:20912"
n2 = "127.0.0.1:20913"
[raft]
heartbeat_interval_ms = 40
[limits]
max_pending_entries = 500
""",
    )
    cfg = nodeconfig.load(p)
    assert cfg.node_id == "n1" and cfg.group == "orders" and cfg.flush == "async"
    assert cfg.address == "127.0.0.1:20912" and cfg.bind == "127.0.0.1:20912"
    assert cfg.raft.heartbeat_interval_ms == 40 and cfg.flush_interval_ms == 20
    assert cfg.max_pending_entries == 500
    assert cfg.voters == ["n0", "n1", "n2"]


def test_flags_override_the_file(tmp_path):
    p = write(tmp_path, f'id = "n0"\ndata_dir = "d"\nflush = "async"\npeers = "{PEERS}"\n')
    cfg = nodeconfig.load(p, flush="sync", election_timeout_min_ms=200, election_timeout_max_ms=400)
    assert cfg.flush == "sync"
    assert (cfg.raft.election_timeout_min_ms, cfg.raft.election_timeout_max_ms) == (200, 400)


def test_flags_alone(tmp_path):
    cfg = nodeconfig.load(None, id="n2", peers=PEERS, data_dir=tmp_path)
    assert cfg.node_id == "n2" and cfg.data_dir == tmp_path


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"id": "n9"}, "not among the peers"),
        ({"flush": "sometimes"}, "flush must be one of"),
        ({"peers": "n0=127.0.0.1,n1=127.0.0.1:2"}, "not host:port"),
        ({"peers": "n0=127.0.0.1:1,n0=127.0.0.1:2"}, "listed twice"),
        ({"peers": "n0=127.0.0.1:1,n1=127.0.0.1:1"}, "share an address"),
        ({"peers": "n0"}, "not id=host:port"),
        ({"heartbeat_interval_ms": 200}, "heartbeat_interval_ms"),
        ({"election_timeout_min_ms": 300, "election_timeout_max_ms": 100}, "election timeout"),
        ({"id": "bad id!"}, "node id"),
        ({"listen": "nowhere"}, "listen"),
    ],
)
def test_bad_settings_name_themselves(tmp_path, overrides, needle):
    kwargs = {"id": "n0", "peers": PEERS, "data_dir": tmp_path, **overrides}
    with pytest.raises(ConfigError, match=needle):
        nodeconfig.load(None, **kwargs)


def test_missing_required_settings(tmp_path):
    with pytest.raises(ConfigError, match="missing required settings: id, data_dir"):
        nodeconfig.load(None, peers=PEERS)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        nodeconfig.load(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        nodeconfig.load(write(tmp_path, "id = \n"))
    with pytest.raises(ConfigError, match="unknown keys"):
        nodeconfig.load(write(tmp_path, 'id = "n0"\ncolour = "blue"\n'))
    with pytest.raises(ConfigError, match=r"\[raft\]: unknown keys"):
        nodeconfig.load(write(tmp_path, f'id = "n0"\ndata_dir = "d"\npeers = "{PEERS}"\n[raft]\nspeed = 3\n'))


def test_data_dir_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        nodeconfig.load(None, id="n0", peers=PEERS, data_dir=f)


def test_a_plugins_table_is_kept_for_the_plugin(tmp_path):
    """Tables the core does not know are the plugin's (``NodeConfig.sections``); it checks them itself
    (the broker: tests/broker/test_settings.py). A stray top-level key is still refused here."""
    base = f'id = "n0"\ndata_dir = "{tmp_path / "n0"}"\npeers = "{PEERS}"\n'
    assert nodeconfig.load(write(tmp_path, base)).sections == {}
    cfg = nodeconfig.load(write(tmp_path, base + "[broker]\nauto_create_topic_queues = 8\n"))
    assert cfg.sections == {"broker": {"auto_create_topic_queues": 8}}
    with pytest.raises(ConfigError, match=r"unknown keys \['auto_create'\]"):
        nodeconfig.load(write(tmp_path, base + "auto_create = true\n"))


def test_index_units_per_file_from_storage_table_env_or_default(tmp_path, monkeypatch):
    base = f'id = "n0"\ndata_dir = "d"\npeers = "{PEERS}"\n'
    monkeypatch.delenv(nodeconfig.INDEX_UNITS_ENV, raising=False)
    assert nodeconfig.load(write(tmp_path, base)).index_units_per_file == 5_242_880, "160 MiB, as DLedger"
    monkeypatch.setenv(nodeconfig.INDEX_UNITS_ENV, "65536")
    assert nodeconfig.load(write(tmp_path, base)).index_units_per_file == 65_536
    cfg = nodeconfig.load(write(tmp_path, base + "[storage]\nindex_units_per_file = 4096\n"))
    assert cfg.index_units_per_file == 4096, "the file wins over the environment"
    for bad in ("100", "true", '"big"', str(1 << 28)):
        with pytest.raises(ConfigError, match="index_units_per_file"):
            nodeconfig.load(write(tmp_path, base + f"[storage]\nindex_units_per_file = {bad}\n"))
    with pytest.raises(ConfigError, match=r"\[storage\]: unknown keys \['segment_size'\]"):
        nodeconfig.load(write(tmp_path, base + "[storage]\nsegment_size = 4096\n"))
    monkeypatch.setenv(nodeconfig.INDEX_UNITS_ENV, "lots")
    with pytest.raises(ConfigError, match=nodeconfig.INDEX_UNITS_ENV):
        nodeconfig.load(write(tmp_path, base))


BASE = """
id = "n0"
data_dir = "var/n0"
[peers]
n0 = "127.0.0.1:20911"
n1 = "127.0.0.1:20912"
"""


def test_dial_table_is_not_a_peer_and_is_read_again(tmp_path):
    """[dial] says where to reach a member that joins later; it never joins [peers] (the starting voters), and
    ``dial_address`` reads the file as it is now (``member add`` writes it while the node runs)."""
    p = write(tmp_path, BASE + '[dial]\nn3 = "127.0.0.1:30914"\n')
    cfg = nodeconfig.load(p)
    assert cfg.dial == {"n3": "127.0.0.1:30914"}
    assert cfg.voters == ["n0", "n1"] and "n3" not in cfg.sections
    assert nodeconfig.dial_address(cfg, "n3") == "127.0.0.1:30914"
    assert nodeconfig.dial_address(cfg, "n4") is None
    p.write_text(BASE + '[dial]\nn3 = "127.0.0.1:30914"\nn4 = "127.0.0.1:30915"\n')
    assert nodeconfig.dial_address(cfg, "n4") == "127.0.0.1:30915"
    p.write_text(BASE + '[dial]\nn4 = "not an address"\n')  # a bad entry: the table the node started with
    assert nodeconfig.dial_address(cfg, "n4") is None
    p.write_text(BASE + "[dial\n")  # a file that does not parse: the same
    assert nodeconfig.dial_address(cfg, "n3") == "127.0.0.1:30914"


@pytest.mark.parametrize(
    "table, needle",
    [
        ('[dial]\nn3 = "nowhere"\n', "[dial] n3"),
        ("[dial]\nn3 = 30914\n", "[dial] n3"),
        ('[dial]\n"bad id!" = "127.0.0.1:1"\n', "[dial]: node id"),
        ('dial = "n3=127.0.0.1:1"\n', "[dial] must be a table"),
    ],
)
def test_bad_dial_entries_name_themselves(tmp_path, table, needle):
    text = BASE.replace("[peers]", table + "[peers]") if table.startswith("dial") else BASE + table
    with pytest.raises(ConfigError) as e:
        nodeconfig.load(write(tmp_path, text))
    assert needle in str(e.value)
