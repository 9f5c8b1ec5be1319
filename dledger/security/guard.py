"""Who may call what: the server interceptor that authenticates every call and authorizes it before any
servicer runs, so a refused call writes nothing (docs/security.md).

- ``dledger.v1.RaftPeer``: only a member proving its node id (``tls.PeerVerifier``); every Raft message in the
  call must come from that node (``src``), so a member cannot speak for another.
- Health checking and reflection: open (they reveal no data).
- Everything else: a signed user (``auth.verify``), then the permission the method and request need: ``RULES``
  for the log's own services, and the ``ServiceRules`` a node's plugin brings for its services
  (``NodePlugin.security_rules``: the broker's are in broker_adapter/security_rules.py). A method nobody lists
  needs ``admin``, so a service added later is closed until someone opens it.

Before refusing what a user change could make acceptable (an unknown access key, a signature that does not
match, a missing permission), the guard catches up (``catch_up``, ``catchup.CatchUp.refresh``: this node applies
everything the leader had committed when the call arrived) and checks once more, so a change acknowledged
before the call holds here too. An accepted call waits for nothing.

Missing or bad credentials: UNAUTHENTICATED; a forbidden action: PERMISSION_DENIED, unless the service's rules
answer refusals themselves (``ServiceRules.refusal``: a protocol whose answers carry their own status). Refusals
are logged with the access key or node id and the reason, never a secret.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import grpc

from dledger.security import auth
from dledger.security.tls import PeerIdentityError, PeerVerifier
from dledger.security.users import User, is_user_command

log = logging.getLogger("dledger.security")

RAFT: Final = "dledger.v1.RaftPeer"
OPEN_SERVICES: Final = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})

# A need: ("user",) any authenticated user; ("admin",); ("publish", topic); ("subscribe", topic, group or None
# for any group). The raw log counts as admin's: it can hold anything, a broker's messages included.
Need = tuple[str | None, ...]
Rule = Callable[[Any], list[Need]]  # a request (None for a client stream) -> what the call needs

if TYPE_CHECKING:  # grpc.RpcMethodHandler is generic in its stubs only
    # The guard stands before every service, so requests and answers are any service's messages (or bytes).
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]
    # On grpc.aio a handler's behaviours are coroutine functions and async generators; grpc-stubs type them as
    # the synchronous server's (plain callables and iterators), so the guard reads them as these (``cast``).
    UnaryBehavior = Callable[[Any, Context], Awaitable[Any]]
    UnaryStreamBehavior = Callable[[Any, Context], AsyncIterator[Any]]
    StreamUnaryBehavior = Callable[[AsyncIterator[Any], Context], Awaitable[Any]]
    StreamStreamBehavior = Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]
KV_TOPIC: Final = "%KV"


@dataclass(frozen=True, slots=True)
class ServiceRules:
    """Who may call a plugin's service: brought by the plugin that serves it (``NodePlugin.security_rules``)."""

    service: str  # the full service name, e.g. "pkg.v1.Service"
    methods: Mapping[str, Rule]  # method name -> what a call needs; a method not here needs admin
    # For a service whose handlers take the request's bytes: method name -> the request class to read them with.
    request_class: Callable[[str], type | None] | None = None
    # For a protocol whose answers carry their own status: (method name, code, why) -> the answer to send instead
    # of a gRPC error (UNAUTHENTICATED or PERMISSION_DENIED).
    refusal: Callable[[str, grpc.StatusCode, str], Any] | None = None


RULES: Final[dict[str, Rule]] = {
    "/dledger.v1.DLedger/Metadata": lambda r: [("user",)],
    "/dledger.v1.KV/Put": lambda r: [("publish", KV_TOPIC)],
    "/dledger.v1.KV/Delete": lambda r: [("publish", KV_TOPIC)],
    "/dledger.v1.KV/CompareAndSwap": lambda r: [("publish", KV_TOPIC)],
    "/dledger.v1.KV/Get": lambda r: [("subscribe", KV_TOPIC, None)],
    "/dledger.v1.Security/ListUsers": lambda r: [("admin",)],
}
_ADMIN: Final[list[Need]] = [("admin",)]


def allowed(user: User, need: Need) -> bool:
    if need == ("user",):
        return True
    if need[0] == "subscribe" and need[2] is None:  # a group-less read: any group of the topic will do
        return "admin" in user.permissions or any(
            p.split(":")[1] in ("*", need[1]) for p in user.permissions if p.startswith("subscribe:")
        )
    return user.allows(describe(need))  # no None left here: only a group-less read has one


def describe(need: Need) -> str:
    return ":".join(x if x is not None else "*" for x in need)


class SecurityInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        node_id: str,
        user_of: Callable[[str], User | None],
        peers: PeerVerifier,
        skew_s: int = auth.DEFAULT_SKEW_S,
        *,
        catch_up: Callable[[], Awaitable[bool]] | None = None,
        services: Sequence[ServiceRules] = (),
    ):
        self._id = node_id
        self._user_of = user_of
        self._peers = peers
        self._skew = skew_s
        self._catch_up = catch_up
        self._services = {s.service: s for s in services}
        self._answers: dict[str, tuple[type | None, Callable[[grpc.StatusCode, str], Any] | None]] = {}
        self._rules: dict[str, Rule] = dict(RULES)
        for s in services:
            self._rules.update({f"/{s.service}/{m}": rule for m, rule in s.methods.items()})

    def _own_answers(self, method: str) -> tuple[type | None, Callable[[grpc.StatusCode, str], Any] | None]:
        """(the request class when the handler takes bytes, the refusal answer when the protocol has its own):
        worked out once per method, not at every call."""
        known = self._answers.get(method)
        if known is not None:
            return known
        service, _, name = method[1:].partition("/")
        rules = self._services.get(service)
        request, answer = None, None
        if rules is not None:
            request = rules.request_class(name) if rules.request_class is not None else None
            refusal = rules.refusal
            answer = (lambda code, why: refusal(name, code, why)) if refusal is not None else None
        self._answers[method] = (request, answer)
        return request, answer

    def _secret_of(self, access_key: str) -> str | None:
        user = self._user_of(access_key)
        return user.secret_key if user is not None else None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        method = details.method
        service = method.split("/")[1] if method.count("/") == 2 else ""
        if handler is None or service in OPEN_SERVICES:
            return handler
        md = details.invocation_metadata or ()
        if service == RAFT:
            try:
                node = self._peers.verify(md)
            except PeerIdentityError as e:
                log.warning("%s: refused %s: %s", self._id, method, e)
                return _refused(handler, grpc.StatusCode.UNAUTHENTICATED, str(e), None)
            return _peer_checked(handler, node, self._id)
        access_key: str | auth.AuthenticationError
        try:
            access_key = auth.verify(md, self._secret_of, skew_s=self._skew)
        except auth.UnknownCredentials as e:
            access_key = await self._authenticate_after_catch_up(md, e)
        except auth.AuthenticationError as e:  # missing, malformed or stale: no user change alters that
            access_key = e
        if isinstance(access_key, auth.AuthenticationError):
            log.warning("%s: refused %s: %s", self._id, method, access_key)
            why = f"unauthenticated: {access_key}"
            return _refused(handler, grpc.StatusCode.UNAUTHENTICATED, why, self._own_answers(method)[1])
        user = self._user_of(access_key)
        assert user is not None, "verified just now (no await since): the access key names a user"
        rule = self._rules.get(method)
        if handler.request_streaming:
            needs = _ADMIN if rule is None else rule(None)
            return await self._check_streaming(handler, method, user, needs)
        return self._authorized(handler, method, user, rule or (lambda r: _ADMIN))

    async def _authenticate_after_catch_up(
        self, md: Sequence[tuple[str, str | bytes]], first: auth.AuthenticationError
    ) -> str | auth.AuthenticationError:
        """The access key once this node has caught up with the leader, or why the call is still refused."""
        if self._catch_up is None:
            return first
        await self._catch_up()
        try:
            return auth.verify(md, self._secret_of, skew_s=self._skew)
        except auth.AuthenticationError as e:
            return e

    def _forbidden(self, user: User | None, method: str, needs: list[Need], access_key: str) -> str | None:
        missing = [describe(n) for n in needs if user is None or not allowed(user, n)]
        if not missing:
            return None
        return f"user {access_key!r} may not call {method}: it needs {', '.join(missing)}"

    async def _refusal_after_catch_up(
        self, access_key: str, method: str, needs: list[Need]
    ) -> tuple[grpc.StatusCode, str] | None:
        """A missing permission: catch up with the leader (a grant may be on its way here), then check again
        with the user as it is now; the refusal (logged: UNAUTHENTICATED when the user was removed meanwhile)
        or None."""
        if self._catch_up is not None:
            await self._catch_up()
        user = self._user_of(access_key)
        if user is None:
            why = f"unauthenticated: unknown access key {access_key!r}"
            log.warning("%s: refused %s: %s", self._id, method, why)
            return grpc.StatusCode.UNAUTHENTICATED, why
        forbidden = self._forbidden(user, method, needs, access_key)
        if forbidden is None:
            return None
        log.warning("%s: refused %s", self._id, forbidden)
        return grpc.StatusCode.PERMISSION_DENIED, forbidden

    async def _check_streaming(self, handler: Handler, method: str, user: User, needs: list[Need]) -> Handler:
        if self._forbidden(user, method, needs, user.access_key) is not None:
            refusal = await self._refusal_after_catch_up(user.access_key, method, needs)
            if refusal is not None:
                return _refused(handler, *refusal, self._own_answers(method)[1])
        if method == "/dledger.v1.DLedger/AppendStream":
            inner = cast("StreamStreamBehavior", handler.stream_stream)

            async def guarded(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
                async def checked() -> AsyncIterator[Any]:
                    async for r in requests:
                        if any(is_user_command(b) for b in r.bodies):
                            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _USER_COMMAND)
                        yield r

                async for out in inner(checked(), context):
                    yield out

            return _same_kind(handler, guarded)
        if handler.stream_stream is not None:
            return self._with_stream_check(handler, method, user.access_key)
        return handler

    def _with_stream_check(self, handler: Handler, method: str, access_key: str) -> Handler:
        """A request stream's later requests may each need more than the call's start did (a producer
        session's batches, each to its own topics): the service asks ``stream_refusal`` for each, answered
        here as a unary call would be (a grant on its way is waited for)."""
        inner = cast("StreamStreamBehavior", handler.stream_stream)  # async under grpc.aio (see Handler)

        async def check(needs: list[Need]) -> str | None:
            if self._forbidden(self._user_of(access_key), method, needs, access_key) is None:
                return None
            refusal = await self._refusal_after_catch_up(access_key, method, needs)
            return None if refusal is None else refusal[1]

        async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            _STREAM_CHECK.set(check)  # this call's task, and the tasks the service starts for it
            async for out in inner(requests, context):
                yield out

        return _same_kind(handler, checked)

    def _authorized(self, handler: Handler, method: str, user: User, rule: Rule) -> Handler:
        request_class, answer = self._own_answers(method)
        raw_append = method == "/dledger.v1.DLedger/Append"

        def needs_of(request: Any) -> list[Need] | str:
            """What the call needs, or a refusal no user change alters (a body shaped like a user command)."""
            if request_class is not None and isinstance(request, bytes | bytearray | memoryview):
                request = request_class.FromString(bytes(request))  # type: ignore[attr-defined]
            if raw_append and any(is_user_command(b) for b in request.bodies):
                return _USER_COMMAND
            try:
                return rule(request)
            except (AttributeError, ValueError) as e:  # a request that is not the method's: let it fail there
                log.debug("%s: no rule input for %s: %s", self._id, method, e)
                return _ADMIN

        def check(request: Any) -> str | list[Need] | None:
            """None: allowed (the normal path, no wait); a refusal; or needs that are missing now (to check
            again after catching up, ``refusal``)."""
            try:
                needs = needs_of(request)
            except Exception as e:  # unparsable: the servicer's own parser answers INVALID_ARGUMENT
                log.debug("%s: %s: %s", self._id, method, e)
                return None
            if isinstance(needs, str):
                return needs
            return needs if self._forbidden(user, method, needs, user.access_key) is not None else None

        async def refusal(why: str | list[Need]) -> tuple[grpc.StatusCode, str | None]:
            """(code, the refusal or None once a catch-up allowed the call)."""
            if isinstance(why, str):
                return grpc.StatusCode.PERMISSION_DENIED, why
            r = await self._refusal_after_catch_up(user.access_key, method, why)
            return r if r is not None else (grpc.StatusCode.OK, None)

        if handler.unary_unary is not None:
            inner = cast("UnaryBehavior", handler.unary_unary)

            async def unary(request: Any, context: Context) -> Any:
                why = check(request)
                if why is not None:
                    code, refused = await refusal(why)
                    if refused is not None:
                        if answer is not None:
                            return answer(code, refused)
                        await context.abort(code, refused)
                return await inner(request, context)

            return _same_kind(handler, unary)
        inner_stream = cast("UnaryStreamBehavior", handler.unary_stream)

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            why = check(request)
            if why is not None:
                code, refused = await refusal(why)
                if refused is not None:
                    if answer is not None:
                        yield answer(code, refused)
                        return
                    await context.abort(code, refused)
            async for out in inner_stream(request, context):
                yield out

        return _same_kind(handler, unary_stream)


# Inside a request-streaming call on a secure group: the check of what one of its requests needs. Set by the
# guard for the call's own task (a context variable: nothing outlives the call, nothing is shared between calls).
_STREAM_CHECK: contextvars.ContextVar[Callable[[list[Need]], Awaitable[str | None]] | None] = (
    contextvars.ContextVar("dledger_stream_check", default=None)
)


async def stream_refusal(needs: list[Need]) -> str | None:
    """Why the caller of the request stream being served may not do what ``needs`` says, or None: it may (and
    always on a group without security, where no guard runs)."""
    check = _STREAM_CHECK.get()
    return None if check is None else await check(needs)


_USER_COMMAND: Final = (
    "a body shaped like a user command cannot be appended: use `dledger user` (docs/security.md)"
)


def _same_kind(handler: Handler, behavior: Callable[..., object]) -> Handler:
    """A method handler like ``handler`` (same streaming kind and (de)serializers) running ``behavior``."""
    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _refused(
    handler: Handler, code: grpc.StatusCode, why: str, answer: Callable[[grpc.StatusCode, str], Any] | None
) -> Handler:
    """A handler that answers the refusal without running the servicer: a gRPC error, or the service's own
    answer (``ServiceRules.refusal``) for a call that does not stream requests."""
    if handler.request_streaming or answer is None:
        if handler.response_streaming:

            async def refuse_stream(request: Any, context: Context) -> AsyncIterator[None]:
                await context.abort(code, why)
                yield  # pragma: no cover  (makes this an async generator)

            return _same_kind(handler, refuse_stream)

        async def refuse(request: Any, context: Context) -> None:
            await context.abort(code, why)

        return _same_kind(handler, refuse)
    if handler.response_streaming:

        async def status_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            yield answer(code, why)

        return _same_kind(handler, status_stream)

    async def status_unary(request: Any, context: Context) -> Any:
        return answer(code, why)

    return _same_kind(handler, status_unary)


def _peer_checked(handler: Handler, node: str, me: str) -> Handler:
    """Every Raft message of the call must come from the node the caller proved to be."""

    def sources(request: Any) -> list[str]:
        if hasattr(request, "messages"):  # DeliverRequest
            return [getattr(m, m.WhichOneof("kind")).src for m in request.messages if m.WhichOneof("kind")]
        return [request.src] if getattr(request, "src", "") else []

    def check(request: Any) -> str | None:
        bad = [s for s in sources(request) if s != node]
        if bad:
            why = f"peer {node!r} sent messages claiming to come from {sorted(set(bad))}: refused"
            log.warning("%s: %s", me, why)
            return why
        return None

    if handler.request_streaming:

        async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for r in requests:
                why = check(r)
                if why is not None:
                    raise PeerIdentityError(why)
                yield r

        if handler.response_streaming:
            inner = cast("StreamStreamBehavior", handler.stream_stream)

            async def stream_stream(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
                try:
                    async for out in inner(checked(requests), context):
                        yield out
                except PeerIdentityError as e:
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

            return _same_kind(handler, stream_stream)

        inner_unary_reply = cast("StreamUnaryBehavior", handler.stream_unary)

        async def stream_unary(requests: AsyncIterator[Any], context: Context) -> Any:
            try:
                return await inner_unary_reply(checked(requests), context)
            except PeerIdentityError as e:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

        return _same_kind(handler, stream_unary)
    inner_unary = cast("UnaryBehavior", handler.unary_unary)

    async def unary(request: Any, context: Context) -> Any:
        why = check(request)
        if why is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        return await inner_unary(request, context)

    return _same_kind(handler, unary)
