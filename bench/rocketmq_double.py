"""A RocketMQ 5 endpoint with no replication behind it, for ``bench.rocketmq_client --double``: the real servicer
(``broker_adapter.rocketmq``) and broker over the in-memory node double of ``tests/broker`` (a one-node "group"
whose appends commit and apply at once: no Raft, no fsync), served by gRPC on 127.0.0.1 in a process of its own.

Against it, the official client runs as fast as the client itself and one gRPC server with the servicer allow:
the client's ceiling on this machine, and the per-message CPU of the face without the log. (Not for anything but
benchmarks: nothing is durable, and nothing is replicated.)

    python -m bench.rocketmq_double --topic T [--queues 4]    # prints the address, serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
from pathlib import Path

import grpc


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
        stop = asyncio.Event()  # SIGTERM (``Double.stop``) ends it with its temporary directory removed
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await server.start()
        print(address, flush=True)
        try:
            await stop.wait()
            await server.stop(0.5)
        finally:
            await servicer.close()
            for _ in gen:
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topic", action="append", required=True)
    ap.add_argument("--queues", type=int, default=4)
    args = ap.parse_args()
    asyncio.run(serve(args.topic, args.queues))


if __name__ == "__main__":
    main()
