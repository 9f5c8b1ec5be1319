"""The console's cost to the nodes: each node's CPU (``/proc/PID/stat``) over ``--seconds`` of a quiet broker
group, then over the same time with ``dledger console`` polling it and a headless Chromium reloading a page every
second (``--page``, the groups page by default). python -m bench.console [--seconds 30] [--secure]; docs/console.md, "Cost".

Needs Debian's chromium and chromium-driver (as tests/console). The group is a plain one of three nodes with a
topic of 4 queues, 1,000 messages and a consumer group that committed on every queue, so every kind of poll runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from selenium.webdriver.common.by import By

from bench.proc_cpu import cpu_seconds
from broker_adapter.client import Consumer, Producer
from dledger import group as grp
from dledger.security.config import ClientSecurity
from tests.console.support import console_with_browser


def node_cpu(g: grp.GroupSpec, seconds: float, during=None) -> dict[str, float]:
    """Percent of one core each node used over ``seconds`` (calling ``during()`` about once a second)."""
    pids = {n.id: grp.read_pid(n) for n in g.nodes}
    before = {i: cpu_seconds([p]) for i, p in pids.items() if p}
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if during is not None:
            during()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
    dt = time.monotonic() - t0
    return {i: round(100 * (cpu_seconds([pids[i]]) - before[i]) / dt, 2) for i in before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--page", default="/")
    ap.add_argument(
        "--secure", action="store_true", help="a secure group: TLS, signed calls, a signed-in user"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        g, _ = grp.up(Path(tmp) / "g", 3, None, state_machine="broker", secure=args.secure)
        sec = ClientSecurity.from_file(Path(g.security)) if args.secure else None
        try:
            grp.wait_for_all(g, 30)
            with Producer(g.addresses, security=sec) as p:
                p.create_topic("bench", 4)
                p.send_batch("bench", [b"x" * 256] * 1000)
            with Consumer(g.addresses, "readers", security=sec) as c:
                for q in range(4):
                    c.commit("bench", q, 100)
            time.sleep(2)
            quiet = node_cpu(g, args.seconds)
            with console_with_browser(Path(tmp) / "g", ["--consumer-group", "readers"], sec) as (
                console,
                browser,
            ):
                if sec is not None:
                    browser.sign_in(console.url, sec.access_key, sec.secret_key)
                browser.driver.get(console.url + args.page)
                time.sleep(2)
                console_before = cpu_seconds([console.proc.pid])
                watched = node_cpu(g, args.seconds, during=browser.driver.refresh)
                console_pct = round(
                    100 * (cpu_seconds([console.proc.pid]) - console_before) / args.seconds, 2
                )
                nodes_shown = len(browser.driver.find_elements(By.CSS_SELECTOR, "tr.node"))
                assert nodes_shown == 3, f"the page showed {nodes_shown} nodes: {console.output()}"
        finally:
            grp.stop_group(g)
    result = {
        "seconds": args.seconds,
        "page": args.page,
        "secure": args.secure,
        "quiet_pct_of_a_core": quiet,
        "with_console_pct_of_a_core": watched,
        "rise_pct_points": {i: round(watched[i] - quiet[i], 2) for i in quiet},
        "console_process_pct_of_a_core": console_pct,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
