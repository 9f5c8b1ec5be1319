"""A broker node imports RocketMQ 5's protocol without the official client (``protocol_without_client``,
broker_adapter/rocketmq/__init__.py), and a process that uses the client after that still gets all of it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from broker_adapter.rocketmq import protocol_without_client
protocol_without_client()
from rocketmq.grpc_protocol import Code, service_pb2
assert service_pb2.SendMessageRequest and Code.OK == 20000
assert not any(m.startswith(("rocketmq.v5", "opentelemetry")) for m in sys.modules), "the client was imported"
from rocketmq import ClientConfiguration, Producer
assert Producer.__module__ == "rocketmq.v5.producer.producer" and ClientConfiguration
try:
    from rocketmq import NoSuchName
except ImportError as e:
    assert "NoSuchName" in str(e)
else:
    raise AssertionError("a name the package lacks was imported")
print("ok")
"""


def test_the_protocol_imports_without_the_client_and_the_client_still_loads_later():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_process_that_imported_the_client_keeps_it():
    import rocketmq

    from broker_adapter.rocketmq import protocol_without_client

    protocol_without_client()
    assert sys.modules["rocketmq"] is rocketmq and rocketmq.Producer
