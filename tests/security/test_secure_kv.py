"""A secure KV group: the KV store counts as the topic %KV, and a key shaped like a user command cannot make
anyone an admin (user commands are signed by a node at their own index; docs/security.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dledger import group as grp
from dledger.errors import DLedgerError, PermissionDeniedError
from dledger.kv.client import AsyncKVClient
from dledger.security import users
from dledger.security.client import SecurityClient
from dledger.security.config import ClientSecurity
from statemachine.kv import encode_put

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_kv_permissions_and_a_forged_grant_in_a_key_changes_nobody(tmp_path):
    g, _ = grp.up(tmp_path / "kv", 3, None, state_machine="kv", secure=True)
    try:
        admin = ClientSecurity.from_file(Path(g.security))
        writer = ClientSecurity(admin.ca_file, "writer", "writer-secret")
        reader = ClientSecurity(admin.ca_file, "reader", "reader-secret")

        async def run() -> None:
            sc = SecurityClient(g.addresses, admin)
            try:
                await sc.call(
                    "AddUser",
                    {"access_key": "writer", "secret_key": "writer-secret", "permissions": ["publish:%KV"]},
                )
                await sc.call(
                    "AddUser",
                    {
                        "access_key": "reader",
                        "secret_key": "reader-secret",
                        "permissions": ["subscribe:%KV:*"],
                    },
                )
                # A KV put's body is op, key length, key, value: bytes 4.. are the key's second byte on. A key
                # and value that spell an add-user command with admin rights, as far as unsigned bytes can.
                forged = users.encode(
                    users.OP_ADD,
                    {"access_key": "mallory", "secret_key": "mallory-secret", "permissions": ["admin"]},
                    b"",
                )
                key, value = b"x" + forged[4:40], forged[40:]
                assert users.is_user_command(encode_put(key, value))  # the entry carries the magic at 4..8
                async with AsyncKVClient(g.addresses, security=writer) as kv:
                    await kv.put(b"k", b"v")
                    await kv.put(key, value)
                    with pytest.raises(PermissionDeniedError, match=r"^PERMISSION_DENIED: "):
                        await kv.get(b"k")
                async with AsyncKVClient(g.addresses, security=reader) as kv:
                    assert (await kv.get(b"k")).value == b"v"
                    assert (await kv.get(key)).value == value  # the KV store applied it as a put
                    with pytest.raises(PermissionDeniedError, match=r"^PERMISSION_DENIED: "):
                        await kv.put(b"k", b"w")
                listed = await sc.call("ListUsers", {})
                assert sorted(u["access_key"] for u in listed["users"]) == ["reader", "writer"]
                mallory = ClientSecurity(admin.ca_file, "mallory", "mallory-secret")
                async with AsyncKVClient(g.addresses, security=mallory, timeout_s=3) as kv:
                    with pytest.raises(DLedgerError, match="UNAUTHENTICATED"):
                        await kv.get(b"k")
            finally:
                await sc.close()

        asyncio.run(run())
        assert json.dumps(grp.status(g)[0].to_json())  # the group still answers
    finally:
        grp.stop_group(g)
