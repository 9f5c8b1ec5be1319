"""Node plugins: resolved from config, bad specs named clearly, services registered with health checking."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dledger.errors import ConfigError
from dledger.plugins import resolve
from statemachine.counter import Counter, encode_add
from tests.runtime.cluster import LocalGroup

pytestmark = pytest.mark.timeout(60)


def test_builtins_resolve_and_bad_specs_are_named():
    assert isinstance(resolve("counter")(None).state_machine, Counter)
    with pytest.raises(ConfigError, match="neither a built-in"):
        resolve("nonsense")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve("no_such_module_xyz:make")
    with pytest.raises(ConfigError, match="no callable"):
        resolve("statemachine.kv:nothing_here")


class _EchoPlugin:
    """A plugin with a service: reuses the standard health service under its own server registration."""

    def __init__(self, config):
        self.state_machine = Counter()
        self.attached_to = None

    def attach(self, node, server):
        self.attached_to = node
        return ("example.Echo",)


def test_config_plugin_hosts_state_machine_and_reports_its_service(tmp_path):
    async def run():
        async with LocalGroup(tmp_path, state_machine_plugin="tests.runtime.test_plugins:_EchoPlugin") as g:
            leader = await g.leader()
            (applied,) = await leader.submit([encode_add(41)])
            assert applied.result == 41
            assert leader.plugin.attached_to is leader
            async with grpc.aio.insecure_channel(leader.config.address) as ch:
                resp = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="example.Echo")
                )
                assert resp.status == health_pb2.HealthCheckResponse.SERVING

    asyncio.run(run())
