"""The node runtime: a pure ``RaftCore`` driven by asyncio, one module per concept.

``node`` (wiring, lifecycle, client API), ``process`` (``dledger node``: its loop and signals), ``datadir`` (lock and stores), ``ready_loop`` (persist
before send, disk full), ``proposals`` (group commit, proposers' futures), ``peers`` (inbound and outbound Raft
messages), ``snapshots``, ``reads`` (read index), ``iothread``. See docs/decisions/0002-runtime-package.md.
"""
