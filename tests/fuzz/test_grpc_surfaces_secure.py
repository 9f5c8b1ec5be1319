"""The tests of ``test_grpc_surfaces.py`` on secure groups (``group up --secure``): fuzzed calls signed by the
admin, each sent again unsigned and by a user without permissions, peer calls carrying a member's proof. A module
of its own so that pytest-xdist's ``--dist loadfile`` runs it beside the plain half on the other worker; the
tests are the same functions, collected here with this module's fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fuzz import test_grpc_surfaces as surfaces
from tests.fuzz.test_grpc_surfaces import (
    test_broker_service,
    test_client_service,
    test_kv_service,
    test_peer_service_from_a_member_with_a_stale_term_writes_nothing,
    test_peer_service_refuses_non_members,
    test_rocketmq_messaging_service,
    test_zz_broker_group_is_whole,
    test_zz_kv_group_is_whole,
)

__all__ = [
    "test_broker_service",
    "test_client_service",
    "test_kv_service",
    "test_peer_service_from_a_member_with_a_stale_term_writes_nothing",
    "test_peer_service_refuses_non_members",
    "test_rocketmq_messaging_service",
    "test_zz_broker_group_is_whole",
    "test_zz_kv_group_is_whole",
]

pytestmark = surfaces.pytestmark


@pytest.fixture(scope="module", params=["secure"])
def broker(tmp_path_factory, request) -> Iterator[surfaces.Target]:
    yield from surfaces._start(tmp_path_factory, "fuzz-broker", "broker", request.param)


@pytest.fixture(scope="module", params=["secure"])
def kv(tmp_path_factory, request) -> Iterator[surfaces.Target]:
    yield from surfaces._start(tmp_path_factory, "fuzz-kv", "kv", request.param)
