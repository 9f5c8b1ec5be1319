"""The console's web application (Starlette, Jinja2 templates, uPlot charts shipped in ``static/``).

Pages are rendered on the server from the poller's latest view; each page asks for its own live part again
every ``refresh_ms`` (``?live=1``: the same template's live block) and the charts' series (``/api/series``), so a
browser costs the groups nothing more than the poller already does. Browsing a queue is a Pull on demand, which
names no consumer group and commits nothing.

Administration (docs/console.md, "Administration"): message search, a consumer group's offset reset and the
dead letters are ``admin_pages.py``'s pages, routed here.

Secure groups: served over TLS, a user signs in with an access key and secret key that the console checks with
a real admin-only call (``ListUsers``) against the group, at most ``login_attempts`` failures in a row per client
address before it answers 429 for a while (``SignInLimiter``); the session cookie is signed (itsdangerous),
SameSite strict, ``Secure`` over TLS, and never holds the secret. Every POST (sign-in, sign-out, watch, running the
audit, reset, resend) needs the session's CSRF token and an Origin (or Referer) naming this console; a change
(reset, resend) also needs the signed-in user to be an admin of the group still (``ListUsers`` asked again).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broker_adapter.console.admin_pages import AdminPages
from broker_adapter.console.poller import Poller, error_text
from dledger.errors import DLedgerError, PermissionDeniedError
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity

HERE = Path(__file__).parent
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; sandbox"
BROWSE_MAX = 100


@dataclass(slots=True)
class ConsoleConfig:
    poller: Poller
    security: ClientSecurity | None = None  # a secure group: users sign in, checked against it
    https: bool = False
    audit_target: Path | None = None  # the group's (or cluster's) directory: `dledger audit` runs on it
    reports_dir: Path | None = None
    refresh_ms: int = 1000
    session_secret: str = ""
    login_attempts: int = 5  # failed sign-ins in a row from one address before it must wait
    login_backoff_s: float = 1.0  # the first wait; doubled at each further failure, up to 5 minutes


class SignInLimiter:
    """Failed sign-ins per client address: after ``attempts`` failures in a row the address waits
    ``backoff_s``, doubled at each later failure (at most ``max_s``); a success forgets the address. At most
    ``max_addresses`` are remembered (the oldest forgotten first)."""

    def __init__(
        self,
        attempts: int,
        backoff_s: float,
        max_s: float = 300.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        if attempts < 1 or backoff_s <= 0:
            raise ValueError(
                f"sign-in limit needs attempts >= 1 and backoff > 0, got {attempts}, {backoff_s}"
            )
        self.attempts, self.backoff_s, self.max_s = attempts, backoff_s, max_s
        self._max_addresses = max_addresses
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # address -> (failures in a row, blocked until)

    def wait_s(self, address: str) -> float:
        """How long ``address`` must still wait before its next try (0: it may try now)."""
        _, until = self._failures.get(address, (0, 0.0))
        return max(0.0, until - self._clock())

    def failed(self, address: str) -> None:
        n, _ = self._failures.pop(address, (0, 0.0))
        n += 1
        until = 0.0
        if n >= self.attempts:
            until = self._clock() + min(self.max_s, self.backoff_s * 2 ** (n - self.attempts))
        self._failures[address] = (n, until)
        while len(self._failures) > self._max_addresses:
            del self._failures[next(iter(self._failures))]

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)


def _ts(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def _ms_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _preview(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


class Console:
    def __init__(self, config: ConsoleConfig):
        self.c = config
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape())
        self.env.filters["ts"] = _ts
        self.env.filters["ms"] = _ms_text
        self.env.filters["preview"] = _preview
        self.audits: dict[str, asyncio.subprocess.Process] = {}
        self.limiter = SignInLimiter(config.login_attempts, config.login_backoff_s)

    # -- guards ------------------------------------------------------------------------------------------------
    def user(self, request: Request) -> str | None:
        if self.c.security is None:
            return "local"
        u = request.session.get("user")
        return u if isinstance(u, str) else None

    def csrf(self, request: Request) -> str:
        tok = request.session.get("csrf")
        if not isinstance(tok, str):
            tok = request.session["csrf"] = secrets.token_urlsafe(32)
        return tok

    async def checked_form(self, request: Request) -> dict[str, str] | Response:
        """The POST's form when its CSRF token and origin are this console's; else a 403 answer."""
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        origin = request.headers.get("origin")
        referer = request.headers.get("referer", "")
        if origin is not None:
            if origin != own:
                return Response("cross-site request refused (Origin)", 403)
        elif not (referer == own or referer.startswith(own + "/")):
            return Response("cross-site request refused (no Origin or Referer of this console)", 403)
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        expected = request.session.get("csrf")
        if not isinstance(expected, str) or not hmac.compare_digest(form.get("csrf", ""), expected):
            return Response("cross-site request refused (CSRF token)", 403)
        return form

    @staticmethod
    def flash(request: Request, text: str, error: bool = False) -> None:
        """A message for the next page this session loads (the outcome of a POST, shown after its redirect)."""
        request.session["flash"] = {"text": text[:2000], "error": error}

    async def admin_form(self, request: Request) -> dict[str, str] | Response:
        """``checked_form``, and on a secure group the signed-in user must still be an admin of it (asked
        again with ``ListUsers``: a user demoted since signing in may no longer change anything)."""
        form = await self.checked_form(request)
        if isinstance(form, Response) or self.c.security is None:
            return form
        user = self.user(request)
        try:
            listing = await self.list_users()
        except DLedgerError as e:
            return Response(f"could not check your permissions with the group: {error_text(e)}", 503)
        admins = {listing["bootstrap_admin"]} | {
            u["access_key"] for u in listing["users"] if "admin" in (u.get("permissions") or [])
        }
        if user not in admins:
            return Response(f"refused: {user!r} is no admin of the group any more; sign in again", 403)
        return form

    async def list_users(self) -> Any:
        """``ListUsers`` on the first group, with the console's own credentials."""
        assert self.c.security is not None
        first = next(iter(self.c.poller.views.values()))
        client = SecurityClient(first.target.addresses, self.c.security, timeout_s=5.0)
        try:
            return await client.call("ListUsers", {})
        finally:
            await client.close()

    def render(self, request: Request, name: str, **ctx: Any) -> Response:
        live = request.query_params.get("live") == "1"
        tpl = self.env.get_template(name)
        ctx.update(
            request=request,
            user=self.user(request),
            secure=self.c.security is not None,
            csrf=self.csrf(request),
            refresh_ms=self.c.refresh_ms,
            poller=self.c.poller,
            now=time.time(),
            flash=request.session.pop("flash", None) if not live else None,
        )
        # ?live=1: only the page's live block, which its script puts in place of the old one
        body = "".join(tpl.blocks["live"](tpl.new_context(ctx))) if live else tpl.render(ctx)
        return HTMLResponse(body)

    def page(self, fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if self.user(request) is None:
                if request.query_params.get("live") == "1" or request.url.path.startswith("/api/"):
                    return Response("sign in", 401)
                return RedirectResponse("/login", 303)
            return await fn(request)

        return guarded

    # -- pages -------------------------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", events=list(reversed(self.c.poller.events)))

    async def topics(self, request: Request) -> Response:
        return self.render(request, "topics.html")

    async def consumers(self, request: Request) -> Response:
        return self.render(request, "consumers.html", rows=self.c.poller.consumer_rows())

    async def watch(self, request: Request) -> Response:
        form = await self.checked_form(request)
        if isinstance(form, Response):
            return form
        name = form.get("consumer_group", "").strip()
        if name:
            self.c.poller.watched.add(name[:200])
        return RedirectResponse("/consumers", 303)

    async def browse(self, request: Request) -> Response:
        q = request.query_params
        p = self.c.poller
        group = q.get("group") or next(iter(p.views), "")
        topic = q.get("topic", "")
        error = ""
        msgs: list[Any] = []
        next_offset = None
        try:
            queue = int(q.get("queue", "0"))
            offset = max(0, int(q.get("offset", "0")))
            count = min(BROWSE_MAX, max(1, int(q.get("count", "20"))))
        except ValueError:
            queue, offset, count, error = 0, 0, 20, "queue, offset and count are integers"
        if topic and group in p.views and not error:
            _, consumer = p.clients(group)
            try:
                msgs = await consumer.pull(topic, queue, offset, count)
                next_offset = msgs[-1].queue_offset + 1 if msgs else None
            except DLedgerError as e:
                error = error_text(e)
        return self.render(
            request,
            "browse.html",
            group=group,
            topic=topic,
            queue=queue,
            offset=offset,
            count=count,
            msgs=msgs,
            next_offset=next_offset,
            error=error,
        )

    async def users(self, request: Request) -> Response:
        listing: Any = None
        error = ""
        if self.c.security is None:
            error = "a plain group has no users (docs/security.md)"
        else:
            try:
                listing = await self.list_users()
            except DLedgerError as e:
                error = error_text(e)
        return self.render(request, "users.html", listing=listing, error=error)

    # -- the audit ---------------------------------------------------------------------------------------------
    def _reports(self) -> list[dict[str, Any]]:
        d = self.c.reports_dir
        if d is None or not d.is_dir():
            return []
        out = []
        for r in sorted((p for p in d.iterdir() if p.is_dir()), reverse=True):
            rc_file = r / "exit_code"
            rc = rc_file.read_text().strip() if rc_file.exists() else None
            htmls = sorted(str(h.relative_to(r)) for h in r.rglob("audit.html"))
            out.append({"name": r.name, "rc": rc, "running": r.name in self.audits, "htmls": htmls})
        return out

    async def audit(self, request: Request) -> Response:
        return self.render(
            request,
            "audit.html",
            reports=self._reports(),
            target=self.c.audit_target,
            error=request.query_params.get("error", ""),
        )

    async def audit_run(self, request: Request) -> Response:
        form = await self.checked_form(request)
        if isinstance(form, Response):
            return form
        if self.c.audit_target is None or self.c.reports_dir is None:
            return RedirectResponse("/audit?error=the+audit+needs+the+console+started+with+--dir", 303)
        if self.audits:
            return RedirectResponse("/audit?error=an+audit+is+running", 303)
        name = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = self.c.reports_dir / name
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "output.txt", "wb")  # noqa: SIM115 - closed when the audit ends
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dledger",
            "audit",
            str(self.c.audit_target),
            "--report",
            str(out),
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.audits[name] = proc

        async def reap() -> None:
            rc = await proc.wait()
            log.close()
            (out / "exit_code").write_text(f"{rc}\n")
            self.audits.pop(name, None)

        asyncio.get_running_loop().create_task(reap())
        return RedirectResponse("/audit", 303)

    async def report_file(self, request: Request) -> Response:
        d = self.c.reports_dir
        if d is None:
            return Response("no reports", 404)
        base = d.resolve()
        path = (base / request.path_params["path"]).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return Response("not found", 404)
        media = "text/plain; charset=utf-8" if path.suffix in (".txt", "") else None
        return FileResponse(path, media_type=media, headers={"Content-Security-Policy": REPORT_CSP})

    # -- sign-in -----------------------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", error="")
        form = await self.checked_form(request)
        if isinstance(form, Response):
            return form
        address = request.client.host if request.client is not None else ""
        wait = self.limiter.wait_s(address)
        if wait > 0:
            error = (
                f"too many failed sign-ins from {address}: try again in {wait:.0f} s"
                if wait >= 1
                else f"too many failed sign-ins from {address}: try again in a second"
            )
            response = self.render(request, "login.html", error=error)
            response.status_code = 429
            response.headers["Retry-After"] = str(max(1, round(wait)))
            return response
        ak, sk = form.get("access_key", ""), form.get("secret_key", "")
        error = await self.check_user(ak, sk)
        if error:
            if not error.startswith("the group did not answer"):  # the group's failure is not the user's
                self.limiter.failed(address)
            return self.render(request, "login.html", error=error)
        self.limiter.succeeded(address)
        request.session.clear()
        request.session.update(user=ak, csrf=secrets.token_urlsafe(32), since=int(time.time()))
        return RedirectResponse("/", 303)

    async def check_user(self, access_key: str, secret_key: str) -> str:
        """ "" when the group accepts this key pair for an admin-only call (ListUsers), else why not."""
        if self.c.security is None:
            return ""
        if not access_key or not secret_key:
            return "give an access key and a secret key"
        first = next(iter(self.c.poller.views.values()))
        as_user = ClientSecurity(self.c.security.ca_file, access_key, secret_key)
        client = SecurityClient(first.target.addresses, as_user, timeout_s=5.0)
        try:
            await client.call("ListUsers", {})
        except DLedgerError as e:
            # The guard's refusals come as their status codes (dledger.transport.convert.error_from_status).
            if isinstance(e, PermissionDeniedError):
                return "refused: this user is no admin of the group"
            if str(e).startswith("UNAUTHENTICATED"):  # an unknown access key or a wrong signature
                return "refused: the group does not know this access key and secret key"
            return f"the group did not answer: {type(e).__name__}"
        finally:
            await client.close()
        return ""

    async def logout(self, request: Request) -> Response:
        form = await self.checked_form(request)
        if isinstance(form, Response):
            return form
        request.session.clear()
        return RedirectResponse("/login", 303)

    # -- data for the charts -----------------------------------------------------------------------------------
    async def series(self, request: Request) -> Response:
        p = self.c.poller
        return JSONResponse(
            {"rates": p.rate_series(), "lags": p.lag_series(), "failovers": p.failover_series()}
        )

    async def state(self, request: Request) -> Response:
        p = self.c.poller
        return JSONResponse(
            {
                "groups": {
                    n: {"leader": v.leader, "term": v.term, "nodes": v.nodes, "polled_at": v.polled_at}
                    for n, v in p.views.items()
                },
                "events": [asdict(e) for e in p.events],
                "consumers": p.consumer_rows(),
            }
        )


class _SecurityHeaders:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", CSP.encode()))
                headers += [
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                    (b"cache-control", b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(config: ConsoleConfig) -> Starlette:
    con = Console(config)
    admin = AdminPages(con)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await config.poller.start()
        try:
            yield
        finally:
            await config.poller.stop()
            admin.pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(con.audits.values()):
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()

    g = con.page
    routes = [
        Route("/", g(con.overview)),
        Route("/topics", g(con.topics)),
        Route("/consumers", g(con.consumers)),
        Route("/consumers/watch", g(con.watch), methods=["POST"]),
        Route("/browse", g(con.browse)),
        Route("/search", g(admin.search)),
        Route("/consumer", g(admin.consumer)),
        Route("/consumer/reset", g(admin.consumer_reset), methods=["POST"]),
        Route("/dlq", g(admin.dlq)),
        Route("/dlq/resend", g(admin.dlq_resend), methods=["POST"]),
        Route("/users", g(con.users)),
        Route("/audit", g(con.audit)),
        Route("/audit/run", g(con.audit_run), methods=["POST"]),
        Route("/audit/report/{path:path}", g(con.report_file)),
        Route("/api/series", g(con.series)),
        Route("/api/state", g(con.state)),
        Route("/login", con.login, methods=["GET", "POST"]),
        Route("/logout", g(con.logout), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(_SecurityHeaders),
        Middleware(
            SessionMiddleware,
            secret_key=config.session_secret or secrets.token_urlsafe(32),
            session_cookie="dledger_console",
            max_age=8 * 3600,
            same_site="strict",
            https_only=config.https,
        ),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.console = con
    return app
