"""``dledger console`` in a real browser (Debian's headless Chromium driven by Selenium) against a real secure
three-node broker group: one group, one console and one browser for the module.

Signing in is checked against the group (a wrong secret and a non-admin are refused, the bootstrap admin gets
in; a second console limits failed sign-ins per address with 429); the page shows the three nodes and the leader;
after the leader is killed (SIGKILL) the new leader shows within a few seconds and the timeline gains the
failover; topics and a consumer group's lag show and follow what is produced; browsing a queue commits nothing;
a message is found by key, by id and by store time; a consumer group's offsets are reset from its page and its
lag follows; dead letters are resent from the DLQ page and consumed by a real consumer; POSTs without the
session's CSRF token or from another origin are refused. With CONSOLE_SCREENSHOTS=DIR each page is saved there
as a PNG (docs/console/ holds them).
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import Select, WebDriverWait

from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.client import BrokerConnection, Consumer, Producer
from broker_adapter.core import message
from dledger import group as grp
from dledger.security.client import call_once
from dledger.security.config import ClientSecurity
from tests.console.support import Browser, ConsoleProcess, console_with_browser

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "orders"
CG = "billing"
SEARCH_TOPIC = "invoices"  # keyed messages, found by the search test
RESET_CG = "ledger"  # the consumer group whose offsets the reset test moves
DLQ_TOPIC, DLQ_CG = "refunds", "refunder"  # two messages of refunds end in %DLQ%refunder
BOB, BOB_SK = "bob", "bob-secret-22"
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


def eventually(what: str, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """``fn()`` once it is truthy (a live block replaced under us counts as not yet), else fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (StaleElementReferenceException, NoSuchElementException):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


class Env:
    def __init__(self, g: grp.GroupSpec, admin: ClientSecurity, console: ConsoleProcess, browser: Browser):
        self.g, self.admin, self.console, self.browser = g, admin, console, browser
        self.driver = browser.driver

    def open(self, path: str) -> None:
        """Load a console page. A page that is none of the console's fails here, naming what was shown and what
        the console logged; a browser error page (the connection failed) is loaded again once, and said so."""
        for attempt in (1, 2):
            self.driver.get(self.console.url + path)
            if self.driver.find_elements(By.TAG_NAME, "main"):
                return
            shown = f"{self.driver.current_url} {self.driver.title!r}"
            if attempt == 1 and self.driver.current_url.startswith("chrome-error://"):
                print(
                    f"{path}: the browser showed an error page ({shown}); loading it again", file=sys.stderr
                )
                continue
            raise AssertionError(
                f"{path}: not a console page: {shown}\n{self.driver.page_source[:800]}\n"
                f"--- console log (tail) ---\n{self.console.output()[-3000:]}"
            )

    def text(self, css: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def shot(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            time.sleep(1.5)  # the charts' next round
            self.driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))

    def sign_in(self, access_key: str, secret_key: str) -> None:
        self.browser.sign_in(self.console.url, access_key, secret_key)

    def follow(self, element: Any) -> None:
        """Click a link or a form's button and wait for the page it leads to (the old one gone)."""
        old = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.driver, 20).until(lambda _: _detached(old))

    def submit(self, button: Any) -> str:
        """``follow`` a form's button; the message the page it leads to shows (the POST's outcome)."""
        self.follow(button)
        return str(eventually("the outcome's message", lambda: self.text("#flash")))


def _detached(old: Any) -> bool:
    """``staleness_of``, also when Chrome, in the middle of the navigation, answers for the old page's element with
    "Node with given id does not belong to the document" instead of a stale-element error."""
    try:
        return bool(staleness_of(old)(None))
    except WebDriverException as e:
        if "does not belong to the document" in str(e):
            return True
        raise


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    g, _ = grp.up(tmp_path_factory.mktemp("console"), 3, None, state_machine="broker", secure=True)
    try:
        grp.wait_for_all(g, 30)
        admin = ClientSecurity.from_file(Path(g.security))
        call_once(g.addresses, "AddUser", {"access_key": BOB, "secret_key": BOB_SK, "permissions": []}, admin)
        with Producer(g.addresses, security=admin) as p:
            p.create_topic(TOPIC, 2)
            for i in range(30):
                p.send(TOPIC, f"order-{i}".encode(), tags="new")  # round robin: 15 a queue
            p.create_topic(SEARCH_TOPIC, 2)
            for i in range(20):  # a queue by the key's hash
                p.send(SEARCH_TOPIC, f"invoice-{i}".encode(), tags="issued", keys=[f"invoice-key-{i}"])
            p.create_topic(DLQ_TOPIC, 1)
            for i in range(2):
                p.send(DLQ_TOPIC, f"refund-{i}".encode(), tags="refund", keys=[f"refund-key-{i}"])
        with Consumer(g.addresses, CG, security=admin) as c:
            c.commit(TOPIC, 0, 5)
            c.commit(TOPIC, 1, 10)
        with Consumer(g.addresses, RESET_CG, security=admin) as c:
            c.commit(TOPIC, 0, 3)
            c.commit(TOPIC, 1, 4)
        with BrokerAdmin(g.addresses, security=admin) as a:
            a.set_group_settings(DLQ_CG, max_attempts=1)
        with Consumer(g.addresses, DLQ_CG, security=admin) as c:
            assert all(c.later(m).dead_lettered for m in c.pull(DLQ_TOPIC, 0, 0))
        group_dir = Path(g.nodes[0].data_dir).parent
        with console_with_browser(group_dir, ["--consumer-group", CG], admin) as (console, browser):
            yield Env(g, admin, console, browser)
    finally:
        grp.stop_group(g)


def test_sign_in_refuses_a_wrong_secret_and_a_non_admin_and_accepts_an_admin(env: Env):
    env.open("/")
    assert env.driver.current_url.endswith("/login"), "a secure console asks to sign in first"
    env.shot("login")
    env.sign_in(env.admin.access_key, "not-the-secret")
    assert "refused" in eventually("the refusal", lambda: env.text("#login-error"))
    env.sign_in(BOB, BOB_SK)  # a user of the group, not an admin
    assert "refused" in eventually("the refusal", lambda: env.text("#login-error"))
    env.sign_in(env.admin.access_key, env.admin.secret_key)
    eventually("signed in", lambda: env.text("#signed-in") == env.admin.access_key)
    assert env.driver.current_url.rstrip("/") == env.console.url


def test_overview_shows_three_nodes_and_the_leader(env: Env):
    leader = grp.wait_for_leader(env.g).id
    env.open("/")
    rows = eventually(
        "three node rows", lambda: len(env.driver.find_elements(By.CSS_SELECTOR, "tr.node")) == 3
    )
    assert rows
    assert eventually("the leader", lambda: env.text(".leader-id")) == leader
    assert env.text(f'tr.node[data-node="{leader}"] .role') == "leader"
    env.shot("groups")


def test_topics_and_the_consumer_groups_lag_follow_what_is_produced(env: Env):
    env.open("/topics")
    eventually("30 messages", lambda: env.text(f'tr[data-topic="{TOPIC}"] .messages') == "30")
    env.open("/consumers")

    def lag(q: int) -> str:
        return env.text(f'tr[data-cg="{CG}"][data-topic="{TOPIC}"][data-queue="{q}"] .lag')

    def expected() -> tuple[str, str]:
        with BrokerConnection(env.g.addresses, security=env.admin) as c:
            ends = next(t.max_offsets for t in c.list_topics() if t.topic == TOPIC)
        return str(ends[0] - 5), str(ends[1] - 10)

    eventually("lag 10 and 5", lambda: (lag(0), lag(1)) == expected() == ("10", "5"))
    with Producer(env.g.addresses, security=env.admin) as p:
        for i in range(20):
            p.send(TOPIC, f"more-{i}".encode())
    want = expected()
    assert sum(int(x) for x in want) == 35
    eventually("the lag after 20 more", lambda: (lag(0), lag(1)) == want)
    env.shot("consumers")
    env.open("/topics")
    eventually("50 messages", lambda: env.text(f'tr[data-topic="{TOPIC}"] .messages') == "50")
    env.shot("topics")


def test_browsing_a_queue_shows_its_messages_and_commits_nothing(env: Env):
    q = urllib.parse.urlencode({"topic": TOPIC, "queue": 0, "offset": 2, "count": 5})
    env.open(f"/browse?{q}")
    rows = env.driver.find_elements(By.CSS_SELECTOR, "#messages tbody tr")
    assert len(rows) == 5 and rows[0].text.startswith("2 "), [r.text for r in rows]
    env.shot("browse")
    with Consumer(env.g.addresses, CG, security=env.admin) as c:
        assert (c.committed(TOPIC, 0), c.committed(TOPIC, 1)) == (5, 10)
    env.open("/users")
    assert BOB in env.text("#users")
    env.shot("users")
    env.open("/audit")
    env.shot("audit")


def test_a_message_is_found_by_key_by_id_and_by_store_time(env: Env):
    env.open("/search?" + urllib.parse.urlencode({"by": "key", "value": "invoice-key-7"}))

    def cells(row: Any) -> dict[str, str]:
        return {
            c: row.find_element(By.CSS_SELECTOR, f".{c}").text for c in ("topic", "queue", "offset", "keys")
        }

    (row,) = env.driver.find_elements(By.CSS_SELECTOR, "#found tr.found")
    with BrokerAdmin(env.g.addresses, security=env.admin) as a:
        (stored,) = a.query_by_key("invoice-key-7", SEARCH_TOPIC)
        (tenth,) = a.query_by_key("invoice-key-10", SEARCH_TOPIC)
    by_key = cells(row)
    assert by_key == {
        "topic": SEARCH_TOPIC,
        "queue": str(stored.queue_id),
        "offset": str(stored.queue_offset),
        "keys": "invoice-key-7",
    }
    assert row.find_element(By.CSS_SELECTOR, ".tags").text == "issued"
    assert row.find_element(By.CSS_SELECTOR, ".body").text == "invoice-7"
    assert "KEYS=invoice-key-7" in row.find_element(By.CSS_SELECTOR, ".props").text
    msg_id = row.get_attribute("data-msg-id")
    assert msg_id == stored.msg_id
    env.shot("search")
    # by id: the id's link
    env.follow(row.find_element(By.CSS_SELECTOR, ".msg-id a"))
    assert "by=id" in env.driver.current_url
    (by_id,) = env.driver.find_elements(By.CSS_SELECTOR, "#found tr.found")
    assert by_id.get_attribute("data-msg-id") == msg_id and cells(by_id) == by_key
    # by store time, through the form: stored before invoice-10 (the end is exclusive)
    env.open("/search")
    Select(env.driver.find_element(By.ID, "search-by")).select_by_visible_text("time")
    env.driver.find_element(By.ID, "search-topic").send_keys(SEARCH_TOPIC)
    env.driver.find_element(By.ID, "search-start").send_keys("0")
    end = datetime.fromtimestamp(tenth.store_ms / 1000, UTC).isoformat(timespec="milliseconds")
    env.driver.find_element(By.ID, "search-end").send_keys(end)
    env.follow(env.driver.find_element(By.ID, "search-submit"))
    assert "by=time" in env.driver.current_url
    bodies = {r.text for r in env.driver.find_elements(By.CSS_SELECTOR, "#found tr.found .body")}
    assert "invoice-0" in bodies and bodies <= {f"invoice-{i}" for i in range(10)}, bodies
    # bad input: a clear message, no error page
    env.open("/search?" + urllib.parse.urlencode({"by": "time", "topic": TOPIC, "start": "yesterday"}))
    assert "ISO 8601" in env.text(".search-error")
    env.open("/search?" + urllib.parse.urlencode({"by": "key", "value": "k", "topic": "no-such-topic"}))
    assert "NotFoundError" in env.text(".search-error") and "no-such-topic" in env.text(".search-error")


def test_a_consumer_groups_offsets_reset_from_its_page_and_its_lag_updates(env: Env):
    env.open("/consumer?" + urllib.parse.urlencode({"cg": RESET_CG}))

    def shown(q: int) -> tuple[str, str]:
        row = f'#queues tr[data-topic="{TOPIC}"][data-queue="{q}"]'
        return env.text(f"{row} .committed"), env.text(f"{row} .lag")

    def ends() -> list[int]:
        with BrokerConnection(env.g.addresses, security=env.admin) as c:
            return list(next(t.max_offsets for t in c.list_topics() if t.topic == TOPIC))

    def committed() -> tuple[int | None, int | None]:
        with Consumer(env.g.addresses, RESET_CG, security=env.admin) as c:
            return c.committed(TOPIC, 0), c.committed(TOPIC, 1)

    def reset(mode: str, value: str = "", queue: str = "") -> str:
        Select(env.driver.find_element(By.ID, "reset-topic")).select_by_visible_text(TOPIC)
        Select(env.driver.find_element(By.ID, "reset-mode")).select_by_visible_text(mode)
        for field, text in (("reset-value", value), ("reset-queue", queue)):
            env.driver.find_element(By.ID, field).clear()
            if text:
                env.driver.find_element(By.ID, field).send_keys(text)
        return env.submit(env.driver.find_element(By.ID, "reset-submit"))

    with Consumer(env.g.addresses, RESET_CG, security=env.admin) as member:  # its pulls make it a member
        member.pull(TOPIC, 0, 0, 1)
        eventually("the pulling consumer among the members", lambda: member.client_id in env.text("#members"))
    e = ends()
    eventually(
        "the committed offsets and lag",
        lambda: (shown(0), shown(1)) == (("3", str(e[0] - 3)), ("4", str(e[1] - 4))),
    )
    flash = reset("earliest")
    assert f"reset {RESET_CG} on {TOPIC} to earliest" in flash and "0: 3 → 0" in flash, flash
    assert committed() == (0, 0)
    assert (shown(0), shown(1)) == (("0", str(e[0])), ("0", str(e[1]))), "the lag right after the reset"
    assert "not since" not in env.text("#moved")
    reset("latest")
    assert committed() == (e[0], e[1])
    assert (shown(0)[1], shown(1)[1]) == ("0", "0")
    flash = reset("offset", "2", queue="1")
    assert committed() == (e[0], 2) and shown(1) == ("2", str(e[1] - 2)), flash
    env.shot("consumer-group")
    # refusals shown on the page: bad input, and the group's own (an offset beyond the end)
    assert "needs an offset" in reset("offset", "two")
    flash = reset("offset", str(e[0] + 100), queue="0")
    assert "InvalidRequestError" in flash and "beyond the end" in flash, flash
    assert "error" in (env.driver.find_element(By.ID, "flash").get_attribute("class") or "")
    assert committed() == (e[0], 2)


def test_a_dead_letter_resent_from_the_dlq_page_is_consumed_by_a_real_consumer(env: Env):
    env.open("/dlq")
    eventually("the DLQ listed", lambda: env.text(f'#dlqs tr[data-cg="{DLQ_CG}"] .count') == "2")
    env.follow(env.driver.find_element(By.LINK_TEXT, DLQ_CG))
    rows = eventually(
        "two dead letters", lambda: env.driver.find_elements(By.CSS_SELECTOR, "#letters tr.letter")
    )
    assert len(rows) == 2
    assert [r.find_element(By.CSS_SELECTOR, ".origin").text for r in rows] == [DLQ_TOPIC, DLQ_TOPIC]
    dead_id = rows[0].find_element(By.CSS_SELECTOR, ".msg-id").text
    flash = env.submit(rows[0].find_element(By.CSS_SELECTOR, "button.resend"))
    assert flash.startswith("resent 1:") and f"→ {DLQ_TOPIC}/0:2" in flash, flash
    env.shot("dlq")

    def consume(n: int) -> list[Any]:
        """Read ``n`` new messages of the topic as a consumer group does, committing them."""
        got: list[Any] = []
        with Consumer(env.g.addresses, "refund-workers", security=env.admin) as c:
            deadline = time.monotonic() + 10
            while len(got) < n and time.monotonic() < deadline:
                start = c.committed(DLQ_TOPIC, 0) or 2  # the two first-sent are dead letters already
                batch = c.pull(DLQ_TOPIC, 0, start, n - len(got), wait_ms=500)
                if batch:
                    c.commit(DLQ_TOPIC, 0, batch[-1].queue_offset + 1)
                got += batch
        return got

    (back,) = consume(1)
    assert (back.body, back.tags, back.keys) == (b"refund-0", "refund", ("refund-key-0",))
    assert back.properties[message.PROPERTY_ORIGIN_MESSAGE_ID] == dead_id and back.msg_id != dead_id
    flash = env.submit(env.driver.find_element(By.ID, "resend-all"))
    assert flash.startswith("resent 2:"), flash
    assert sorted(m.body for m in consume(2)) == [b"refund-0", b"refund-1"]
    # a dead letter that is not there (the form's offset changed under it): the group's refusal, shown
    row = env.driver.find_elements(By.CSS_SELECTOR, "#letters tr.letter")[0]
    env.driver.execute_script("arguments[0].value = '99'", row.find_element(By.NAME, "offset"))
    flash = env.submit(row.find_element(By.CSS_SELECTOR, "button.resend"))
    assert (
        flash.startswith("no dead letter resent; then failed: InvalidRequestError")
        and "beyond the end" in flash
    )
    # a dead letter that is not there: the group's refusal on the page
    env.open("/dlq?" + urllib.parse.urlencode({"cg": "nobody"}))
    assert "NotFoundError" in env.text("#dlq-error")


def _form(
    console: ConsoleProcess, opener: urllib.request.OpenerDirector, fields: dict[str, str]
) -> tuple[int, str]:
    """GET /login for a session and its CSRF token, then POST the sign-in form from this console's origin."""
    with opener.open(console.url + "/login", timeout=10) as r:
        token = re.search(r'name="csrf" value="([^"]+)"', r.read().decode())
    assert token is not None
    body = urllib.parse.urlencode({"csrf": token.group(1), **fields}).encode()
    req = urllib.request.Request(
        console.url + "/login", data=body, headers={"Origin": console.url}, method="POST"
    )
    try:
        with opener.open(req, timeout=10) as r:
            return int(r.status), str(r.geturl()) + "\n" + r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_failed_sign_ins_from_one_address_are_answered_429_for_a_while(env: Env):
    (port,) = grp.free_ports(1)
    group_dir = Path(env.g.nodes[0].data_dir).parent
    args = ["--dir", str(group_dir), "--login-attempts", "2", "--login-backoff", "4"]
    console = ConsoleProcess(args, port, https=True, ca_file=env.admin.ca_file)
    try:
        https = urllib.request.HTTPSHandler(context=console.ssl)
        opener = urllib.request.build_opener(
            https, urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        wrong = {"access_key": env.admin.access_key, "secret_key": "guess"}
        right = {"access_key": env.admin.access_key, "secret_key": env.admin.secret_key}
        for _ in range(2):
            code, page = _form(console, opener, wrong)
            assert code == 200 and "refused" in page
        code, page = _form(console, opener, right)  # even the right secret waits: no more guesses meanwhile
        assert code == 429 and "too many failed sign-ins from 127.0.0.1: try again in" in page, page
        code, page = _form(console, opener, wrong)
        assert code == 429

        def signed_in() -> bool:
            code, page = _form(console, opener, right)
            return code == 200 and 'id="signed-in"' in page

        eventually("a sign-in once the wait is over", signed_in, timeout_s=30)
        # a success forgets the failures: the next wrong one is checked, not refused for the address
        code, page = _form(console, opener, wrong)
        assert code == 200 and "refused" in page
    finally:
        console.stop()


def test_a_user_demoted_after_signing_in_can_no_longer_reset(env: Env):
    with Consumer(env.g.addresses, RESET_CG, security=env.admin) as c:
        before = (c.committed(TOPIC, 0), c.committed(TOPIC, 1))
    dana = {"access_key": "dana", "secret_key": "dana-secret-42"}
    call_once(env.g.addresses, "AddUser", {**dana, "permissions": ["admin"]}, env.admin)
    https = urllib.request.HTTPSHandler(context=env.console.ssl)
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(https, urllib.request.HTTPCookieProcessor(jar))
    code, page = _form(env.console, opener, dana)
    assert code == 200 and 'id="signed-in">dana<' in page, page
    with opener.open(env.console.url + "/consumer?cg=" + RESET_CG, timeout=10) as r:
        token = re.search(r'name="csrf" value="([^"]+)"', r.read().decode())
    assert token is not None
    call_once(env.g.addresses, "Revoke", {"access_key": "dana", "permission": "admin"}, env.admin)
    reset = {"csrf": token.group(1), "cg": RESET_CG, "topic": TOPIC, "mode": "earliest"}
    req = urllib.request.Request(
        env.console.url + "/consumer/reset",
        data=urllib.parse.urlencode(reset).encode(),
        headers={"Origin": env.console.url},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(req, timeout=10)
    assert refused.value.code == 403
    assert "'dana' is no admin of the group any more" in refused.value.read().decode()
    with Producer(env.g.addresses, security=env.admin) as p:
        # a broker entry after the user commands: the broker's reads wait for one (reported to the lead)
        p.create_topic("after-users", 1)
    with Consumer(env.g.addresses, RESET_CG, security=env.admin) as c:
        assert (c.committed(TOPIC, 0), c.committed(TOPIC, 1)) == before, "the refused reset changed nothing"


def test_a_post_needs_the_sessions_csrf_token_and_this_consoles_origin(env: Env):
    cookie = env.driver.get_cookie("dledger_console")
    assert cookie and cookie["sameSite"] == "Strict" and cookie["secure"] and cookie["httpOnly"]
    env.open("/consumers")
    token = eventually(
        "the page's CSRF token", lambda: env.driver.find_element(By.NAME, "csrf").get_attribute("value")
    )
    jar = f"dledger_console={cookie['value']}"
    # the page's polls never set the session cookie (one in flight must not undo a sign-out)
    for poll in ("/consumers?live=1", "/api/series"):
        req = urllib.request.Request(env.console.url + poll, headers={"Cookie": jar})
        with urllib.request.urlopen(req, timeout=10, context=env.console.ssl) as r:
            assert r.status == 200 and r.headers.get("Set-Cookie") is None, poll
    own = env.console.url
    body = urllib.parse.urlencode({"csrf": token, "consumer_group": "intruder"}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": jar}
    assert env.console.post("/consumers/watch", body, {**form, "Origin": "https://evil.example"}) == 403
    assert env.console.post("/consumers/watch", body, form) == 403  # neither Origin nor Referer
    bad = urllib.parse.urlencode({"csrf": "guessed", "consumer_group": "intruder"}).encode()
    assert env.console.post("/consumers/watch", bad, {**form, "Origin": own}) == 403
    assert env.console.post("/audit/run", bad, {**form, "Origin": own}) == 403
    reset = {"csrf": token, "cg": RESET_CG, "topic": TOPIC, "mode": "earliest"}
    assert env.console.post("/consumer/reset", urllib.parse.urlencode(reset).encode(), form) == 403
    resend = {"csrf": "guessed", "group": "", "cg": DLQ_CG, "all": "1"}
    assert (
        env.console.post("/dlq/resend", urllib.parse.urlencode(resend).encode(), {**form, "Origin": own})
        == 403
    )
    with Consumer(env.g.addresses, RESET_CG, security=env.admin) as c:
        assert c.committed(TOPIC, 0) != 0, "the forged reset changed nothing"
    assert "intruder" not in env.text("main")
    # The form itself, from the page: accepted.
    env.driver.find_element(By.ID, "watch-name").send_keys("auditors")
    env.driver.find_element(By.ID, "watch-submit").click()
    eventually("the watched group", lambda: "auditors" in env.text("main"))


def test_the_new_leader_shows_within_seconds_of_a_kill_and_the_timeline_gains_the_failover(env: Env):
    old = grp.wait_for_leader(env.g)
    env.open("/")
    eventually("the leader", lambda: env.text(".leader-id") == old.id)
    spec = next(n for n in env.g.nodes if n.id == old.id)
    t0 = time.monotonic()
    grp.kill_node(spec)
    new = eventually(
        "a new leader on the page", lambda: (lambda x: x if x != old.id else "")(env.text(".leader-id"))
    )
    shown_s = time.monotonic() - t0
    assert new != old.id
    assert shown_s < 5.0, f"the new leader showed {shown_s:.1f} s after the kill"
    row = eventually(
        "the failover in the timeline",
        lambda: [
            r for r in env.driver.find_elements(By.CSS_SELECTOR, "#timeline tr.failover") if new in r.text
        ],
    )
    assert old.id in row[0].text and " s" in row[0].text
    # the failover between the window's two empty ends (more points if the loaded machine saw another election)
    chart = '.chart[data-series="failovers"]'
    eventually(
        "the failover chart's point",
        lambda: int(env.driver.find_element(By.CSS_SELECTOR, chart).get_attribute("data-points") or 0) >= 3,
    )
    print(f"new leader shown {shown_s:.2f} s after the kill; timeline: {row[0].text}")
    env.shot("failover")
