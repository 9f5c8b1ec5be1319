"""Recovering a group whose majority is gone for good (``dledger group recover --from NODE``; docs/membership.md,
"Lost quorum").

Raft cannot commit without a majority, and no membership change can pass without one either: when two nodes
of three are lost for good, the survivor can never serve again on its own. The way out, as etcd's
``--force-new-cluster``, is an operator's decision written into the survivor's stopped log: one configuration
entry, appended after everything it holds, that names the survivor as the only voter. Its term is above every
term the node has seen, and the node's hard state moves to that term with its vote for itself, so no old leader
could ever overwrite it. On its next start the node is a one-node group: it elects itself at once, and its first
entry of the new term commits everything in its log, the new configuration included; `member add` grows it back.

What can be lost is exactly what the survivor never had: an entry the lost majority committed and acknowledged
but never replicated to it. Everything the survivor holds, committed or not, is kept and becomes committed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dledger.core.membership import Configuration
from dledger.nodeconfig import NodeConfig
from dledger.runtime.datadir import COMMIT_INDEX_KEY, base_configuration, lock_data_dir, open_log
from storage import codec
from storage.api import HardState, LogStore, MetaStore

__all__ = ["Recovered", "append_configuration", "make_sole_voter"]


@dataclass(frozen=True, slots=True)
class Recovered:
    node: str
    term: int  # the term of the configuration entry (and of the node's hard state now)
    config_index: int  # where the one-voter configuration entry went
    last_index_before: int  # the survivor's log ended here
    known_committed: (
        int  # what it had recorded as committed (-1: nothing); the rest commits at its next start
    )
    previous: Configuration  # the configuration it was in

    def describe(self) -> str:
        uncommitted = self.last_index_before - max(self.known_committed, -1)
        return (
            f"node {self.node} is now the only voter (configuration entry at index {self.config_index}, term "
            f"{self.term}); it kept its whole log, up to index {self.last_index_before}, of which it knew "
            f"{self.known_committed + 1} entries committed and {uncommitted} more will commit at its next start; "
            f"left behind: {', '.join(m for m in self.previous.members if m != self.node) or 'nobody'}"
        )


def append_configuration(
    log: LogStore, meta: MetaStore, conf: Configuration, term: int, segment_size: int, vote: str | None = None
) -> int:
    """Append ``conf`` as a config entry of ``term`` after the stopped log's last entry, durably, and move the hard
    state to ``term`` (with ``vote``); returns the entry's index. ``term`` must be above every term the log and the
    hard state know, so that no leader of an older term can ever replace the entry."""
    tail = log.tail()
    body = conf.encode()
    pos = codec.place(tail.end_pos, codec.HEADER_SIZE + len(body), segment_size)
    index = tail.last_index + 1
    log.append(codec.encode(index, term, pos, body, tail.chain_crc, magic=codec.MAGIC_CONFIG))
    log.sync()
    meta.save_hard_state(HardState(term=term, vote=vote))
    return index


def make_sole_voter(config: NodeConfig, address: str) -> Recovered:
    """Append to the stopped node's log the configuration that makes it the only voter (at ``address``), and
    move its hard state to that entry's term. Refuses a directory a running node holds (``DirectoryInUseError``)."""
    from dledger.core.raft_log import RaftLog
    from storage.meta_lmdb import LmdbMetaStore

    lock = lock_data_dir(config.data_dir)
    try:
        log = open_log(config, flush="sync")
        meta = LmdbMetaStore(str(config.data_dir / "meta"))
        try:
            base = base_configuration(meta, config)
            previous = RaftLog(log, config.raft.segment_size, base_conf=base).configuration
            tail = log.tail()
            term = max(meta.load_hard_state().term, tail.last_term) + 1
            conf = Configuration.of([config.node_id], addresses={config.node_id: address})
            # The vote goes to itself in the new term: the node will not vote for an old member of that term.
            index = append_configuration(log, meta, conf, term, config.raft.segment_size, vote=config.node_id)
            raw = meta.get(COMMIT_INDEX_KEY)
            known = int(raw) if raw else -1
        finally:
            log.close()
            meta.close()
    finally:
        os.close(lock)
    return Recovered(config.node_id, term, index, tail.last_index, known, previous)
