"""The topics this node knows (the replicated state's table) and their queues, and how an unknown topic comes into
being: with ``[broker] auto_create_topic_queues`` on, the leader creates it through the log (a ``CreateTopic``
entry, so every node agrees); off, it is NOT_FOUND."""

from __future__ import annotations

from broker_adapter.core import commands
from broker_adapter.core.group_commit import GroupCommit
from broker_adapter.core.leadership import Leadership
from broker_adapter.core.model import UnknownQueueError, UnknownTopicError, check_topic
from broker_adapter.core.statemachine import BrokerStateMachine


class TopicRegistry:
    def __init__(
        self, sm: BrokerStateMachine, leadership: Leadership, proposer: GroupCommit, auto_create_queues: int
    ):
        self._sm = sm
        self._leadership = leadership
        self._proposer = proposer
        self.auto_create_queues = auto_create_queues  # 0: an unknown topic is not created

    def queues(self, topic: str) -> int:
        """The topic's queue count on this node (``InvalidTopicError`` / ``UnknownTopicError`` otherwise)."""
        check_topic(topic)
        n = self._sm.topics.get(topic)
        if n is None and topic in self._sm.deleted_topics:
            raise UnknownTopicError(
                topic,
                f"topic {topic!r} was deleted (log entry {self._sm.deleted_topics[topic]}): it takes no messages "
                "until it is created again (dledger topic create)",
            )
        if n is None:
            raise UnknownTopicError(
                topic,
                f"unknown topic {topic!r}: create it first (dledger topic create), or turn on "
                "[broker] auto_create_topic_queues",
            )
        return n

    def check_queue(self, topic: str, queue_id: int) -> None:
        n = self.queues(topic)
        if not 0 <= queue_id < n:
            raise UnknownQueueError(f"unknown queue {topic}/{queue_id}: the topic has queues 0..{n - 1}")

    async def ensure_topic(self, topic: str) -> int:
        """The topic's queue count, the topic created first when it is unknown and auto-creation is on."""
        try:
            return self.queues(topic)
        except UnknownTopicError:
            queues = self.auto_create_queues
            if not queues or topic in self._sm.deleted_topics:
                raise
        self._leadership.require_leader()
        (result,) = await self._proposer.submit([commands.CreateTopic(topic, queues)])
        if isinstance(result, BaseException) and not isinstance(result, commands.CommandError):
            raise result
        # A CommandError here means a concurrent create chose another queue count first: that one stands.
        return self.queues(topic)
