"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``) served by the broker, so the official
RocketMQ clients produce to and consume from a dledger-py group unchanged.

One message model serves both faces: a message sent by a RocketMQ client is an ordinary CommitLog message in
the log (our own ``Consumer`` reads it), and a message sent by our ``Producer`` is received by RocketMQ clients.
What RocketMQ 5 adds on top, consumption by receipt handles with invisible time, is replicated state of the
broker's state machine (``invisibility``), changed only through log commands.

Modules: ``servicer`` (the gRPC service), ``forward`` (followers pass requests to the leader), ``convert``
(RocketMQ v2 messages <-> CommitLog messages), ``receipt`` (receipt handles), ``invisibility`` (the replicated
pop/ack state), ``route`` (routes, assignments, telemetry settings), ``status`` (error -> protocol codes).
Importing this package imports nothing of gRPC; the state machine uses ``invisibility`` alone.
"""

import asyncio
import importlib.util
import sys


def ensure_event_loop() -> None:
    """Give the calling thread a current event loop if it has none, before an official client starts there.

    The official client (``rocketmq-python-client`` 5.1.2) opens its Telemetry stream from the thread that calls
    ``startup()``, and grpc.aio asks that thread for its current loop (the call itself runs on the client's own I/O
    loop). After ``asyncio.run()`` in the same thread there is none, the stream is not opened, and the client fails
    to fetch routes ("There is no current event loop in thread 'MainThread'").
    """
    policy = asyncio.get_event_loop_policy()
    try:
        policy.get_event_loop()
    except RuntimeError:
        policy.set_event_loop(policy.new_event_loop())


def protocol_without_client() -> None:
    """Let this process import RocketMQ 5's generated protocol (``rocketmq.grpc_protocol``) without the official
    client: the ``rocketmq`` package's own ``__init__`` imports the whole client, OpenTelemetry's exporters
    included, which took 40% of a broker node's imports, and a node that serves the protocol never runs the
    client. The package is registered unexecuted; its ``__init__`` runs at the first name asked of it
    (``from rocketmq import Producer``), so a process that does use the client later still gets all of it. A
    process that imported the package already keeps it as it is."""
    if "rocketmq" in sys.modules:
        return
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or spec.loader is None:
        return  # not installed: the plugin says so when it tries the protocol
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def client(name: str) -> object:
        del package.__getattr__  # type: ignore[attr-defined]  # once: the real __init__ defines the names
        loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'rocketmq' has no attribute {name!r}") from None

    package.__getattr__ = client  # type: ignore[method-assign]
    sys.modules["rocketmq"] = package
