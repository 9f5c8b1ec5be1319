"""Fault injection against a local group of real node processes (issue 9).

``proxy`` puts a controllable TCP hop between every ordered pair of nodes, ``nemesis`` injects faults (kill -9,
SIGSTOP pauses, partitions, one-way loss and latency, a full disk, a torn log tail), ``workload`` drives clients
while faults run and records every outcome in a ``history``, ``checkers`` judge the history against the nodes'
final files, and ``runner`` ties one seeded run together (``dledger chaos``).
"""
