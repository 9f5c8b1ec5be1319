"""Which messages a consumer's subscription takes: by tag (``TagA || TagB``) or by a SQL92 expression over the
message's properties (``broker_adapter.core.sqlfilter``). Protocol-neutral: the RocketMQ face builds one from a
``FilterExpression``, our own Pull from ``PullRequest.filter`` (docs/broker.md, "Filters"); the broker's receive
and pull paths call it on each stored message they consider."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from broker_adapter.core import message
from broker_adapter.core.sqlfilter import SqlFilter, compile_filter

Select = Callable[[message.Message], bool]


def everything(m: message.Message) -> bool:
    return True


def by_tags(tags: frozenset[str] | None) -> Select:
    """Messages whose tag is one of ``tags`` (None: every message)."""
    if tags is None:
        return everything
    return lambda m: m.tags in tags


@lru_cache(maxsize=1024)
def _compiled(text: str) -> SqlFilter:
    """Parsing is pure: a subscription's expression, sent with every receive, is parsed once per process."""
    return compile_filter(text)


def by_sql(text: str) -> Select:
    """Messages for which the SQL92 expression ``text`` is true; ``FilterSyntaxError`` when it does not parse."""
    f = _compiled(text)
    return lambda m: f.matches(m.properties)
