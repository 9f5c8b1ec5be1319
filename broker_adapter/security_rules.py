"""Who may call the broker's services on a secure group: the rules the broker plugin brings to the node's guard
(``dledger.security.guard.ServiceRules``, ``BrokerPlugin.security_rules``; docs/security.md).

A need is ``("user",)`` (any signed user), ``("publish", topic)`` or ``("subscribe", topic, group)``, with
``None`` for "any group of the topic" (a read by offset that commits nothing). On RocketMQ 5's face a refusal is
the protocol's own answer: the response's Status carries UNAUTHORIZED (40100) or FORBIDDEN (40300), which the
official clients turn into their exceptions; its handlers take the request's bytes (``rocketmq/handlers.py``),
so the guard reads them with the method's request class.
"""

from __future__ import annotations

from typing import Any, Final

import grpc

from dledger.security.guard import ServiceRules

BROKER_SERVICE: Final = "dledger.v1.Broker"
ROCKETMQ_SERVICE: Final = "apache.rocketmq.v2.MessagingService"
UNAUTHORIZED: Final = 40100  # apache.rocketmq.v2.Code
FORBIDDEN: Final = 40300


def _rmq_topic(r: Any) -> str:
    return r.message_queue.topic.name if r.HasField("message_queue") else r.topic.name


BROKER: Final = ServiceRules(
    BROKER_SERVICE,
    {
        "Send": lambda r: [("publish", r.topic)],
        # a producer session: a signed user to open it; each batch is checked for its topics as it comes
        # (``guard.stream_refusal``, asked by ``BrokerServicer.SendStream``)
        "SendStream": lambda r: [("user",)],
        "Pull": lambda r: [("subscribe", r.topic, None)],
        "ListTopics": lambda r: [("user",)],
        "Route": lambda r: [("user",)],
        "CommitOffset": lambda r: [("subscribe", r.topic, r.group)],
        "QueryOffset": lambda r: [("subscribe", r.topic, r.group)],
        "Later": lambda r: [("subscribe", r.topic, r.group)],
    },
)

ADMIN_SERVICE: Final = "dledger.v1.BrokerAdmin"
# Reads any signed user may make; a query names a topic to read from it (without one: admin). Changes (delete,
# reset, settings) are not listed: they need admin.
ADMIN: Final = ServiceRules(
    ADMIN_SERVICE,
    {
        "TopicStatus": lambda r: [("user",)],
        "ListGroups": lambda r: [("user",)],
        "DescribeGroup": lambda r: [("user",)],
        "GetConfig": lambda r: [("user",)],
        "QueryMessages": lambda r: [("subscribe", r.topic, None)] if r.topic else [("admin",)],
    },
)

ROCKETMQ_METHODS: Final = {
    "QueryRoute": lambda r: [("user",)],
    "Heartbeat": lambda r: [("user",)],
    "QueryAssignment": lambda r: [("user",)],
    "Telemetry": lambda r: [("user",)],
    "NotifyClientTermination": lambda r: [("user",)],
    "SendMessage": lambda r: [("publish", m.topic.name) for m in r.messages] or [("user",)],
    "EndTransaction": lambda r: [("publish", r.topic.name)],
    "RecallMessage": lambda r: [("publish", r.topic.name)],
    "ReceiveMessage": lambda r: [("subscribe", _rmq_topic(r), r.group.name)],
    "AckMessage": lambda r: [("subscribe", r.topic.name, r.group.name)],
    "ChangeInvisibleDuration": lambda r: [("subscribe", r.topic.name, r.group.name)],
    "ForwardMessageToDeadLetterQueue": lambda r: [("subscribe", r.topic.name, r.group.name)],
    "PullMessage": lambda r: [("subscribe", _rmq_topic(r), r.group.name)],
    "UpdateOffset": lambda r: [("subscribe", _rmq_topic(r), r.group.name)],
    "GetOffset": lambda r: [("subscribe", _rmq_topic(r), r.group.name)],
    "QueryOffset": lambda r: [("subscribe", _rmq_topic(r), None)],
    "SyncLiteSubscription": lambda r: [("subscribe", r.topic.name, r.group.name)],
}


def _classes(method: str) -> tuple[Any, Any] | None:
    """(request class, response class) of a RocketMQ 5 method; None when the official client package (whose
    generated code the face serves) is not installed."""
    try:
        from rocketmq.grpc_protocol import service_pb2
    except ImportError:
        return None
    m = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name.get(method)
    if m is None:
        return None
    return getattr(service_pb2, m.input_type.name), getattr(service_pb2, m.output_type.name)


def _request_class(method: str) -> type | None:
    classes = _classes(method)
    return classes[0] if classes is not None else None


def _refusal(method: str, code: grpc.StatusCode, why: str) -> Any:
    classes = _classes(method)
    if classes is None:
        raise RuntimeError(f"{ROCKETMQ_SERVICE}/{method} is served without its generated code")
    rmq_code = UNAUTHORIZED if code == grpc.StatusCode.UNAUTHENTICATED else FORBIDDEN
    return classes[1](status={"code": rmq_code, "message": why})


ROCKETMQ: Final = ServiceRules(ROCKETMQ_SERVICE, ROCKETMQ_METHODS, _request_class, _refusal)


def rules() -> tuple[ServiceRules, ...]:
    return (BROKER, ADMIN, ROCKETMQ)
