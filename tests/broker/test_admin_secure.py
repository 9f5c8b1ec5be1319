"""The BrokerAdmin service on a real secure three-node group (``broker_adapter/security_rules.py`` ``ADMIN``,
enforced by every node's guard, ``dledger/security/guard.py``): reads need a signed user, a query without a topic
and every change (reset, delete, settings) need admin, and a refusal is PERMISSION_DENIED naming what is missing.
``test_admin_core.py`` checks the rules as data; this checks them as a client meets them. (The guard's refusal
carries no error class: the client maps its code to ``PermissionDeniedError``, whose message starts with the code.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_adapter.admin_client import BrokerAdmin
from broker_adapter.client import Consumer, Producer
from dledger import group as grp
from dledger.errors import PermissionDeniedError
from dledger.security.client import call_once
from dledger.security.config import ClientSecurity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC, CG = "ledger", "billing"


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[tuple[grp.GroupSpec, ClientSecurity, ClientSecurity]]:
    """(the group, its bootstrap admin, ``bob``: a user who may read and commit on the topic, no admin)."""
    g, _ = grp.up(tmp_path_factory.mktemp("admin-secure"), 3, None, state_machine="broker", secure=True)
    try:
        grp.wait_for_all(g, 30)
        admin = ClientSecurity.from_file(Path(g.security))
        bob = ClientSecurity(admin.ca_file, "bob", "bob-secret-42")
        permissions = [f"publish:{TOPIC}", f"subscribe:{TOPIC}:{CG}"]
        add = {"access_key": "bob", "secret_key": "bob-secret-42", "permissions": permissions}
        call_once(g.addresses, "AddUser", add, admin)
        # carol: a signed user, no permission
        add = {"access_key": "carol", "secret_key": "carol-secret-42", "permissions": []}
        call_once(g.addresses, "AddUser", add, admin)
        with Producer(g.addresses, security=admin) as p:
            p.create_topic(TOPIC, 2)
            p.send_batch(TOPIC, [(f"m-{i}".encode(), "t", [f"key-{i}"]) for i in range(6)])
        with Consumer(g.addresses, CG, security=bob) as c:
            c.commit(TOPIC, 0, 1)
        yield g, admin, bob
    finally:
        grp.stop_group(g)


def test_a_user_reads_and_queries_a_topic_it_may_read(secure):
    g, _, bob = secure
    with BrokerAdmin(g.addresses, security=bob) as a:
        assert sum(q.max_offset for q in a.topic_status(TOPIC)) == 6
        assert [s.group for s in a.list_groups()] == [CG]
        assert a.describe_group(CG)[0].committed == 1
        assert "retention_hours" in a.get_config()
        (m,) = a.query_by_key("key-4", TOPIC)
        assert m.body == b"m-4"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda a: a.reset_offsets(CG, TOPIC, "earliest"), id="ResetOffsets"),
        pytest.param(lambda a: a.delete_group(CG), id="DeleteGroup"),
        pytest.param(lambda a: a.delete_topic(TOPIC), id="DeleteTopic"),
        pytest.param(lambda a: a.set_config(max_delay_ms=1000), id="SetConfig"),
        pytest.param(lambda a: a.query_by_key("key-4"), id="QueryMessages-without-topic"),
    ],
)
def test_a_change_or_a_query_of_every_topic_needs_admin(secure, call):
    g, admin, bob = secure
    with (
        BrokerAdmin(g.addresses, security=bob) as a,
        pytest.raises(PermissionDeniedError) as refused,
    ):
        call(a)
    why = str(refused.value)
    assert why.startswith("PERMISSION_DENIED: "), why
    assert "user 'bob' may not call /dledger.v1.BrokerAdmin/" in why and "it needs admin" in why, why
    with BrokerAdmin(g.addresses, security=admin) as a:  # nothing changed
        assert a.describe_group(CG)[0].committed == 1
        assert sum(q.max_offset for q in a.topic_status(TOPIC)) == 6


def test_a_query_of_a_topic_the_user_may_not_read_names_the_permission(secure):
    g, admin, _ = secure
    carol = ClientSecurity(admin.ca_file, "carol", "carol-secret-42")
    with BrokerAdmin(g.addresses, security=carol) as a:
        assert sum(q.max_offset for q in a.topic_status(TOPIC)) == 6, "a signed user reads a topic's status"
        with pytest.raises(
            PermissionDeniedError, match=f"^PERMISSION_DENIED: .*it needs subscribe:{TOPIC}:\\*"
        ):
            a.query_by_key("key-4", TOPIC)


def test_the_admin_changes_and_queries_every_topic(secure):
    g, admin, bob = secure
    with BrokerAdmin(g.addresses, security=admin) as a:
        assert [m.body for m in a.query_by_key("key-2")] == [b"m-2"]
        assert [(r.old, r.new) for r in a.reset_offsets(CG, TOPIC, "earliest")] == [(1, 0), (None, 0)]
        a.set_config(max_delay_ms=60_000)
        assert a.get_config()["max_delay_ms"] == {"value": 60_000, "source": "log"}
    with Consumer(g.addresses, CG, security=bob) as c:
        assert c.committed(TOPIC, 0) == 0, "the user's own group sees the admin's reset"


def test_a_read_after_a_user_command_last_in_the_log_answers(secure):
    """A broker read waits until the node applied its whole log (``Sender.settled``): with a user command as
    the log's last entry (applied by the security layer, never by the broker's dispatcher) it used to wait for
    a dispatcher index that never came, and failed after 10 s with an unknown outcome."""
    g, admin, _ = secure
    add = {"access_key": "dave", "secret_key": "dave-secret-42", "permissions": []}
    call_once(g.addresses, "AddUser", add, admin)  # now the last entry of the log
    with BrokerAdmin(g.addresses, security=admin, timeout_s=8.0, retry_for_s=2.0) as a:
        assert sum(q.max_offset for q in a.topic_status(TOPIC)) == 6
        assert [s.group for s in a.list_groups()] == [CG]
