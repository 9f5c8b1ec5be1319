"""The protocol-neutral broker: send, pop and invisibility, delivery timers, transactions, group commit, the
allocator and the state machine. It imports no face (``broker_adapter.service``, ``broker_adapter.rocketmq``);
the faces convert to and from it (docs/broker.md, "Package layout")."""
