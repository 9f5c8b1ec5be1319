"""``dledger console`` in a real browser (Debian's headless Chromium driven by Selenium) against a real secure
three-node broker group: one group, one console and one browser for the module.

Signing in is checked against the group (a wrong secret and a non-admin are refused, the bootstrap admin gets
in); the page shows the three nodes and the leader; after the leader is killed (SIGKILL) the new leader shows
within a few seconds and the timeline gains the failover; topics and a consumer group's lag show and follow what
is produced; browsing a queue commits nothing; POSTs without the session's CSRF token or from another origin are
refused. With CONSOLE_SCREENSHOTS=DIR each page is saved there as a PNG (docs/console/ holds them).
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from broker_adapter.client import BrokerConnection, Consumer, Producer
from dledger import group as grp
from dledger.security.client import call_once
from dledger.security.config import ClientSecurity
from tests.console.support import Browser, ConsoleProcess, console_with_browser

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "orders"
CG = "billing"
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
        self.driver.get(self.console.url + path)

    def text(self, css: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def shot(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            time.sleep(1.5)  # the charts' next round
            self.driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))

    def sign_in(self, access_key: str, secret_key: str) -> None:
        self.browser.sign_in(self.console.url, access_key, secret_key)


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
        with Consumer(g.addresses, CG, security=admin) as c:
            c.commit(TOPIC, 0, 5)
            c.commit(TOPIC, 1, 10)
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


def test_a_post_needs_the_sessions_csrf_token_and_this_consoles_origin(env: Env):
    cookie = env.driver.get_cookie("dledger_console")
    assert cookie and cookie["sameSite"] == "Strict" and cookie["secure"] and cookie["httpOnly"]
    env.open("/consumers")
    token = env.driver.find_element(By.NAME, "csrf").get_attribute("value")
    jar = f"dledger_console={cookie['value']}"
    own = env.console.url
    body = urllib.parse.urlencode({"csrf": token, "consumer_group": "intruder"}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": jar}
    assert env.console.post("/consumers/watch", body, {**form, "Origin": "https://evil.example"}) == 403
    assert env.console.post("/consumers/watch", body, form) == 403  # neither Origin nor Referer
    bad = urllib.parse.urlencode({"csrf": "guessed", "consumer_group": "intruder"}).encode()
    assert env.console.post("/consumers/watch", bad, {**form, "Origin": own}) == 403
    assert env.console.post("/audit/run", bad, {**form, "Origin": own}) == 403
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
    eventually(
        "the failover chart's point",
        lambda: (
            env.driver.find_element(By.CSS_SELECTOR, '.chart[data-series="failovers"]').get_attribute(
                "data-points"
            )
            == "3"  # the failover between the window's two empty ends
        ),
    )
    print(f"new leader shown {shown_s:.2f} s after the kill; timeline: {row[0].text}")
    env.shot("failover")
