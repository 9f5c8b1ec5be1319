"""``SignInLimiter`` (broker_adapter/console/app.py) with a given clock: the waits after failed sign-ins, their
doubling and cap, what a success forgets, and how many addresses it remembers. The console's browser test
checks the same limit over HTTP (429) against a real secure group."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from broker_adapter import cli as broker_cli
from broker_adapter.console.app import SignInLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_an_address_waits_after_n_failures_doubling_up_to_the_cap():
    clock = Clock()
    lim = SignInLimiter(3, 1.0, max_s=4.0, clock=clock)
    for _ in range(2):
        lim.failed("10.0.0.1")
        assert lim.wait_s("10.0.0.1") == 0, "fewer failures than the limit: no wait"
    lim.failed("10.0.0.1")
    assert lim.wait_s("10.0.0.1") == 1.0
    assert lim.wait_s("10.0.0.2") == 0, "another address is not held back"
    clock.t += 1.0
    assert lim.wait_s("10.0.0.1") == 0
    waits = []
    for _ in range(4):
        lim.failed("10.0.0.1")
        waits.append(lim.wait_s("10.0.0.1"))
    assert waits == [2.0, 4.0, 4.0, 4.0]
    lim.succeeded("10.0.0.1")
    lim.failed("10.0.0.1")
    assert lim.wait_s("10.0.0.1") == 0, "a success forgets the failures before it"


def test_it_remembers_a_bounded_number_of_addresses():
    lim = SignInLimiter(1, 10.0, max_addresses=2, clock=Clock())
    for a in ("a", "b", "c"):
        lim.failed(a)
    assert [lim.wait_s(a) for a in ("a", "b", "c")] == [0, 10.0, 10.0]


@pytest.mark.parametrize("attempts, backoff", [(0, 1.0), (3, 0.0)])
def test_a_limit_that_would_never_wait_or_never_let_in_is_refused(attempts, backoff):
    with pytest.raises(ValueError, match="attempts >= 1 and backoff > 0"):
        SignInLimiter(attempts, backoff)


def test_the_command_refuses_such_a_limit_before_starting():
    app = typer.Typer()
    broker_cli.register(app)
    args = ["console", "--addresses", "127.0.0.1:1", "--login-attempts", "0"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "--login-attempts must be >= 1" in r.output, r.output
