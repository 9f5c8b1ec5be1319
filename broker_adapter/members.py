"""A consumer group's members as a node sees them (docs/console.md, "Members"): our own consumers that
pulled for the group lately, named by the client id their pulls carry (``PullRequest.consumer_group`` and
``client_id``). RocketMQ 5 clients are members by their heartbeats instead (``rocketmq.servicer``); the plugin
answers ``DescribeGroup`` with both (``plugin.BrokerPlugin._members``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from broker_adapter.core.model import check_group
from dledger.errors import InvalidRequestError

MEMBER_TTL_S: Final = 30.0  # a member that neither pulled (nor heartbeat) this long is gone
MAX_MEMBERS: Final = 10_000  # (group, client) pairs remembered; the least recently seen go first
MAX_CLIENT_ID: Final = 256


class PullingMembers:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def pulled(self, group: str, client_id: str) -> None:
        """A pull for ``group`` by ``client_id`` (both empty: an anonymous read, remembered nowhere)."""
        if not group and not client_id:
            return
        if not group or not client_id:
            raise InvalidRequestError("a pull names both its consumer_group and its client_id, or neither")
        check_group(group)
        if len(client_id) > MAX_CLIENT_ID:
            raise InvalidRequestError(f"client_id is {len(client_id)} characters; at most {MAX_CLIENT_ID}")
        key = (group, client_id)
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)
        if len(self._seen) > MAX_MEMBERS:
            self._seen.popitem(last=False)

    def of(self, group: str) -> list[str]:
        """The client ids that pulled for ``group`` within ``MEMBER_TTL_S``."""
        now = self._clock()
        return sorted(cid for (g, cid), t in self._seen.items() if g == group and now - t < MEMBER_TTL_S)
