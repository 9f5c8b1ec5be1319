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
