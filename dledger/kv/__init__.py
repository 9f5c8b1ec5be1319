"""The key-value application on the runtime: the KV gRPC service a node serves, its client, the ``dledger kv``
commands and the node plugins of the pure state machines (``statemachine.kv``, ``statemachine.counter``)."""
