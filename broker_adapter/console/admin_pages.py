"""The console's administration pages (docs/console.md, "Administration"): message search, a consumer group's
offset reset and dead-letter (DLQ) listing and resend, the three operations of issue 28 an operator reaches for in
the RocketMQ dashboard.

They are what an operator asks a group to find or change, where ``app.py`` is the web application around them
(its guards, sign-in, rendering and the pages that only show the poller's view); one module per concept. Each goes
through ``BrokerAdmin`` (``broker_adapter/admin_client.py``): the poller keeps one patient client per group, called
in a worker thread of these pages' own (``ADMIN_THREADS``), never one a poll round holds. An error a group answers
is shown on the page. A change (reset, resend) passes ``Console.admin_form`` first: the CSRF token, the origin
and, on a secure group, a user who is still an admin of it (docs/console.md, "Secure groups").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from broker_adapter.admin_client import BrokerAdmin, FoundMessage, epoch_ms, origin_topic
from broker_adapter.console.poller import GroupView, error_text
from broker_adapter.core import topics as topic_names
from broker_adapter.core.admin import RESET_MODES
from dledger.errors import DLedgerError, NotFoundError

if TYPE_CHECKING:
    from broker_adapter.console.app import Console

ADMIN_THREADS = 4  # blocking admin calls operators asked for, at once (a search of 4 groups is one round)
SEARCH_MAX = 100  # messages a search shows, per group
DLQ_SHOWN = 100  # dead letters the DLQ page lists
RESEND_ALL_MAX = 1000  # dead letters "resend all" sends, at most


class AdminPages:
    """The handlers of ``/search``, ``/consumer``, ``/consumer/reset``, ``/dlq`` and ``/dlq/resend`` (routed by
    ``app.create_app``), rendered and guarded by the console's ``Console``."""

    def __init__(self, con: Console):
        self.con = con
        self.poller = con.c.poller
        self.pool = ThreadPoolExecutor(ADMIN_THREADS, thread_name_prefix="console-admin")

    def _views(self, group: str) -> list[GroupView]:
        """The group named (every group when "")."""
        views = self.poller.views
        if not group:
            return list(views.values())
        if group not in views:
            raise ValueError(f"unknown group {group!r}: this console shows {', '.join(views)}")
        return [views[group]]

    async def _admin(self, group: str, fn: Callable[[BrokerAdmin], Any]) -> Any:
        """``fn(the group's patient BrokerAdmin)`` in a worker thread of the console's own (the client is
        blocking; the polls have theirs)."""
        admin = self.poller.admin(group, patient=True)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, admin)

    # -- message search ----------------------------------------------------------------------------------------
    async def search(self, request: Request) -> Response:
        """Messages by key, by message id (the key index) or by store time (a topic's queues), in one group or
        every group; commits nothing."""
        q = request.query_params
        form = {k: q.get(k, "") for k in ("group", "by", "value", "topic", "start", "end", "limit")}
        form["by"] = form["by"] or "key"
        found: list[tuple[str, FoundMessage]] = []
        errors: list[str] = []
        asked = bool(form["value"] or form["start"] or form["end"])
        if asked:
            try:
                views = self._views(form["group"])
                limit = int(form["limit"] or 20)
                if not 1 <= limit <= SEARCH_MAX:
                    raise ValueError(f"limit is 1..{SEARCH_MAX}, got {limit}")
                query = self._query(form, limit)
            except ValueError as e:
                errors.append(str(e))
            else:
                results = await asyncio.gather(
                    *(self._admin(v.target.name, query) for v in views), return_exceptions=True
                )
                for v, r in zip(views, results, strict=True):
                    if isinstance(r, DLedgerError):
                        errors.append(f"{v.target.name}: {error_text(r)}")
                    elif isinstance(r, BaseException):
                        raise r
                    else:
                        found += [(v.target.name, m) for m in r]
        return self.con.render(
            request, "search.html", form=form, found=found, errors=errors, asked=asked, modes=RESET_MODES
        )

    @staticmethod
    def _query(form: dict[str, str], limit: int) -> Callable[[BrokerAdmin], list[FoundMessage]]:
        """The search the form asks for, checked (ValueError naming the field) before any group is asked."""
        by, value, topic = form["by"], form["value"].strip(), form["topic"].strip()
        if by in ("key", "id"):
            if not value:
                raise ValueError(f"a search by {by} needs a {by}")
            if by == "key":
                return lambda a: a.query_by_key(value, topic, limit)
            return lambda a: a.query_by_id(value, topic, limit)
        if by != "time":
            raise ValueError(f"search by key, id or time, got {by!r}")
        if not topic:
            raise ValueError("a search by store time needs a topic")
        start = epoch_ms(form["start"]) if form["start"].strip() else 0
        end = epoch_ms(form["end"]) if form["end"].strip() else int(time.time() * 1000) + 1
        return lambda a: a.query_by_time(topic, start, end, limit)

    # -- one consumer group: offsets, members, reset -------------------------------------------------------
    async def consumer(self, request: Request) -> Response:
        cg = request.query_params.get("cg", "").strip()
        p = self.poller
        topics = sorted({t.topic for v in p.views.values() for t in v.topics if "%" not in t.topic})
        return self.con.render(request, "consumer.html", cg=cg, topics=topics, modes=RESET_MODES)

    async def consumer_reset(self, request: Request) -> Response:
        form = await self.con.admin_form(request)
        if isinstance(form, Response):
            return form
        cg, topic, mode = form.get("cg", ""), form.get("topic", "").strip(), form.get("mode", "")
        back = RedirectResponse(f"/consumer?{urlencode({'cg': cg})}", 303)
        try:
            if not topic:
                raise ValueError("name the topic whose offsets to reset")
            if mode not in RESET_MODES:
                raise ValueError(f"reset to one of {', '.join(RESET_MODES)}, got {mode!r}")
            value = form.get("value", "").strip()
            if mode == "offset":
                if not value.isdigit():
                    raise ValueError(f"a reset to an offset needs an offset (0 or more), got {value!r}")
                amount = int(value)
            else:
                amount = epoch_ms(value) if mode == "time" else 0
            queue_text = form.get("queue", "").strip()
            if queue_text and not queue_text.isdigit():
                raise ValueError(
                    f"queue is a queue number (0 or more) or empty for every queue, got {queue_text!r}"
                )
            queue = int(queue_text) if queue_text else None
            views = [v for v in self._views(form.get("group", "")) if any(t.topic == topic for t in v.topics)]
            if not views:
                raise ValueError(f"no group of this console has the topic {topic!r}")
        except ValueError as e:
            self.con.flash(request, str(e), error=True)
            return back
        done, failed = [], []
        for v in views:
            name = v.target.name
            try:
                plan = await self._admin(name, lambda a: a.reset_offsets(cg, topic, mode, amount, queue))
            except DLedgerError as e:
                failed.append(f"{name}: {error_text(e)}")
                continue
            self.poller.watched.add(cg)
            await self.poller.refresh_consumer_group(name, cg, patient=True)
            moves = ", ".join(f"{r.queue_id}: {'—' if r.old is None else r.old} → {r.new}" for r in plan)
            done.append(f"{name}: {moves}")
        if done:
            self.con.flash(request, f"reset {cg} on {topic} to {mode} ({'; '.join(done)})")
        if failed:
            self.con.flash(request, f"reset {cg} on {topic} failed: {'; '.join(failed + done)}", error=True)
        return back

    # -- dead letters ------------------------------------------------------------------------------------------
    async def dlq(self, request: Request) -> Response:
        q = request.query_params
        p = self.poller
        dlqs = [
            (name, t.topic.removeprefix(topic_names.DLQ_PREFIX), sum(t.max_offsets))
            for name, v in p.views.items()
            for t in v.topics
            if t.topic.startswith(topic_names.DLQ_PREFIX)
        ]
        group, cg = q.get("group") or next(iter(p.views), ""), q.get("cg", "")
        letters: list[tuple[FoundMessage, str]] = []
        error = ""
        if cg:
            try:
                self._views(group)  # checks the name
                found = await self._admin(group, lambda a: list(a.dead_letters(cg, DLQ_SHOWN)))
                letters = [(m, origin_topic(m)) for m in found]
            except ValueError as e:
                error = str(e)
            except NotFoundError as e:
                error = f"{cg!r} has no dead-letter topic in {group}: {error_text(e)}"
            except DLedgerError as e:
                error = error_text(e)
        return self.con.render(
            request, "dlq.html", dlqs=dlqs, group=group, cg=cg, letters=letters, error=error, shown=DLQ_SHOWN
        )

    async def dlq_resend(self, request: Request) -> Response:
        form = await self.con.admin_form(request)
        if isinstance(form, Response):
            return form
        group, cg = form.get("group", ""), form.get("cg", "")
        back = RedirectResponse(f"/dlq?{urlencode({'group': group, 'cg': cg})}", 303)
        try:
            if group not in self.poller.views:
                raise ValueError(
                    f"unknown group {group!r}: this console shows {', '.join(self.poller.views)}"
                )
            if not cg:
                raise ValueError("name the consumer group whose dead letter to resend")
            queue, offset = form.get("queue", ""), form.get("offset", "")
            if not form.get("all") and not (queue.isdigit() and offset.isdigit()):
                raise ValueError(
                    f"a dead letter is named by its queue and offset, got {queue!r} and {offset!r}"
                )
        except ValueError as e:
            self.con.flash(request, f"resend: {e}", error=True)
            return back
        dlq = topic_names.dlq_topic(cg)

        def resend(a: BrokerAdmin) -> tuple[list[str], str]:
            """(what was resent, why it stopped: "" when it did not)."""
            which = [(int(queue), int(offset))] if not form.get("all") else None
            sent: list[str] = []
            try:
                if which is None:
                    which = [(m.queue_id, m.queue_offset) for m in a.dead_letters(cg, RESEND_ALL_MAX)]
                for q, o in which:
                    r = a.resend(cg, q, o)
                    sent.append(f"{dlq}/{q}:{o} → {r.topic}/{r.queue_id}:{r.queue_offset} ({r.msg_id})")
            except DLedgerError as e:
                return sent, error_text(e)
            return sent, ""

        sent, failed = await self._admin(group, resend)
        done = f"resent {len(sent)}: {'; '.join(sent)}" if sent else "no dead letter resent"
        self.con.flash(request, f"{done}; then failed: {failed}" if failed else done, error=bool(failed))
        return back
