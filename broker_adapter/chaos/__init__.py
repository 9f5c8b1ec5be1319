"""The broker under fault injection: its chaos workload (producers and a consumer group) and the checkers of its
messages in the nodes' final files, registered with the generic runner (``dledger.chaos``) as an entry point."""
