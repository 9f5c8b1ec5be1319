"""The security step of ``make demo`` runs against real processes and shows each refusal it promises."""

from __future__ import annotations

import pytest
from rich.console import Console

from broker_adapter import security_demo as demo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_the_security_demo_shows_acceptance_and_every_refusal(tmp_path):
    console = Console(record=True, width=200)
    assert demo.run(tmp_path / "secure", console) == 0
    out = console.export_text()
    assert "alice -> orders        acknowledged" in out
    assert "alice -> payments      PERMISSION_DENIED" in out
    assert "alice, wrong secret    UNAUTHENTICATED" in out
    assert "plaintext client       UNAVAILABLE" in out
    assert "n1 cert claiming n2    UNAUTHENTICATED" in out
    assert "peer claiming to be 'n2' presented the certificate of node 'n1'" in out
