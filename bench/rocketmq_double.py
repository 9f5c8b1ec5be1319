"""A RocketMQ 5 endpoint with no replication behind it, for ``bench.rocketmq_client --double``: the real servicer
(``broker_adapter.rocketmq``) and broker over the in-memory node double of ``tests/broker`` (a one-node "group"
whose appends commit and apply at once: no Raft, no fsync), served by gRPC on 127.0.0.1 in a process of its own.

Against it, the official client runs as fast as the client itself and one gRPC server with the servicer allow:
the client's ceiling on this machine, and the per-message CPU of the face without the log. (Not for anything but
benchmarks: nothing is durable, and nothing is replicated.)

    python -m bench.rocketmq_double --topic T [--queues 4]    # prints the address, serves until killed

``--bare`` serves instead one empty unary method (``BARE_METHOD``: bytes in, nothing out, no servicer) on a
grpc.aio server configured as a node's: what one call costs a grpc.aio server on this machine, the floor under
every RocketMQ call (``bench.rocketmq_client --per-call``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
from pathlib import Path

import grpc

BARE_METHOD = "/bench.Bare/Empty"


async def _until_terminated(server: grpc.aio.Server) -> None:
    """Run until SIGTERM (``Double.stop``), then stop the server."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0.5)


async def serve_bare() -> None:
    """One empty method, the node's server options, no interceptor, on uvloop as a node runs
    (``dledger.runtime.node.serve``): the grpc.aio floor of a unary call."""
    from dledger.transport.grpc import SERVER_OPTIONS

    async def empty(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        return b""

    def same(b: bytes) -> bytes:
        return b

    server = grpc.aio.server(options=list(SERVER_OPTIONS))
    service, method = BARE_METHOD.strip("/").split("/")
    handler = grpc.unary_unary_rpc_method_handler(empty, request_deserializer=same, response_serializer=same)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await _until_terminated(server)


async def serve(topics: list[str], queues: int) -> None:
    from broker_adapter.rocketmq import handlers
    from broker_adapter.rocketmq.servicer import MessagingServicer
    from tests.broker.test_broker import made, topic

    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    address = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-rmq-double-") as tmp:
        gen = made.__wrapped__(Path(tmp))
        broker, node = next(gen)
        node.config.peers = {node.id: address}  # routes name this server
        for t in topics:
            await topic(broker, t, queues)
        servicer = MessagingServicer(broker)
        handlers.add_to_server(servicer, server)
        await server.start()
        print(address, flush=True)
        try:  # SIGTERM ends it with its temporary directory removed
            await _until_terminated(server)
        finally:
            await servicer.close()
            for _ in gen:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topic", action="append", default=[])
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--bare", action="store_true", help="serve one empty method instead (no servicer)")
    args = ap.parse_args()
    if args.bare:
        import uvloop

        uvloop.run(serve_bare())
    elif not args.topic:
        ap.error("--topic is required (or --bare)")
    else:
        asyncio.run(serve(args.topic, args.queues))


if __name__ == "__main__":
    main()
