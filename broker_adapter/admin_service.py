"""The BrokerAdmin gRPC service (proto/broker_adapter/v1/admin.proto): requests in, ``broker_adapter.core.admin``
call, responses out; an error the broker raises becomes the gRPC status of its class (docs/broker.md,
Administration)."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from broker_adapter.core.admin import Admin
from broker_adapter.service import stored_message
from broker_adapter.v1 import admin_pb2, admin_pb2_grpc
from dledger.errors import DLedgerError
from dledger.plugins import NodeHandle
from dledger.transport.grpc import abort_rpc

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["BrokerAdmin"].full_name


def _config(shown: dict) -> admin_pb2.ConfigResponse:
    return admin_pb2.ConfigResponse(
        values=[
            admin_pb2.ConfigValue(key=k, value_json=json.dumps(v["value"]), source=v["source"])
            for k, v in shown.items()
        ]
    )


def _answering(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """An RPC whose ``DLedgerError`` becomes the gRPC status of its class (with the leader's address when a
    follower refused a change)."""

    @functools.wraps(method)
    async def answered(self: AdminServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except DLedgerError as e:
            await abort_rpc(context, e, self._node.address_of)

    return answered


class AdminServicer(admin_pb2_grpc.BrokerAdminServicer):
    def __init__(self, admin: Admin, node: NodeHandle, members: Callable[[str], list[str]] = lambda g: []):
        self._admin = admin
        self._node = node
        self._members = members  # a group's RocketMQ 5 consumers connected to this node

    @_answering
    async def TopicStatus(self, request, context):
        queues = await self._admin.topic_status(request.topic, request.allow_follower)
        return admin_pb2.TopicStatusResponse(
            topic=request.topic,
            queues=[
                admin_pb2.QueueStatus(
                    queue_id=q.queue_id,
                    min_offset=q.min_offset,
                    max_offset=q.max_offset,
                    last_store_timestamp=q.last_store_ms,
                )
                for q in queues
            ],
        )

    @_answering
    async def DeleteTopic(self, request, context):
        n = await self._admin.delete_topic(request.topic)
        return admin_pb2.DeleteTopicResponse(queues=n)

    @_answering
    async def ListGroups(self, request, context):
        groups = await self._admin.list_groups(request.allow_follower)
        return admin_pb2.ListGroupsResponse(
            groups=[
                admin_pb2.GroupSummary(group=g.group, topics=g.topics, lag=g.lag, has_settings=g.has_settings)
                for g in groups
            ]
        )

    @_answering
    async def DescribeGroup(self, request, context):
        queues = await self._admin.describe_group(
            request.group, request.topic or None, request.allow_follower
        )
        return admin_pb2.DescribeGroupResponse(
            group=request.group,
            members=self._members(request.group),
            queues=[
                admin_pb2.GroupQueue(
                    topic=q.topic,
                    queue_id=q.queue_id,
                    committed_offset=q.committed or 0,
                    has_committed=q.committed is not None,
                    max_offset=q.max_offset,
                    lag=q.lag,
                    in_flight=q.in_flight,
                )
                for q in queues
            ],
        )

    @_answering
    async def DeleteGroup(self, request, context):
        await self._admin.delete_group(request.group)
        return admin_pb2.DeleteGroupResponse()

    @_answering
    async def ResetOffsets(self, request, context):
        plan = await self._admin.reset_offsets(
            request.group,
            request.topic,
            request.mode,
            request.value,
            request.queue_id if request.HasField("queue_id") else None,
        )
        return admin_pb2.ResetOffsetsResponse(
            queues=[
                admin_pb2.OffsetReset(
                    queue_id=r.queue_id, old_offset=r.old or 0, had_old=r.old is not None, new_offset=r.new
                )
                for r in plan
            ]
        )

    @_answering
    async def QueryMessages(self, request, context):
        limit = request.limit or 32
        if request.by == "time":
            found = await self._admin.query_time(
                request.topic, request.start_ms, request.end_ms, limit, request.allow_follower
            )
        else:
            found = await self._admin.query(
                request.by, request.value, request.topic, limit, request.allow_follower
            )
        return admin_pb2.QueryMessagesResponse(messages=[stored_message(m) for m in found])

    @_answering
    async def GetConfig(self, request, context):
        return _config(self._admin.config())

    @_answering
    async def SetConfig(self, request, context):
        shown = await self._admin.set_config(dict(request.values))
        return _config(shown)


def service_names() -> Sequence[str]:
    return (SERVICE,)
