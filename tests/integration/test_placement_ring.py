"""The Placement sync and audit shared by several conductors, against a real Placement: each
conductor syncs the hosts the ring gives it, and a host's writes happen under its lease, so a
host two conductors both try (a rebalance, a conductor that died writing it) is written once.
"""

from __future__ import annotations

import uuid as uuidlib

import pytest
from sqlalchemy import update

from acceld.conductor.placement.sync import PlacementSync
from acceld.db.clock import sql_now
from acceld.db.models import leases
from tests.integration.test_placement_sync import add_accelerator, sync_rows
from tests.support.placement import PlacementServer

pytestmark = pytest.mark.integration


@pytest.fixture
def host() -> str:
    return f"cn-{uuidlib.uuid4().hex[:10]}"


class Only:
    """The ring's answer for a conductor that owns ``hosts``."""

    def __init__(self, *hosts: str) -> None:
        self.hosts = set(hosts)

    def owns(self, hostname: str) -> bool:
        return hostname in self.hosts


def provider_exists(placement: PlacementServer, rp: str) -> bool:
    return placement.get(f"/resource_providers/{rp}").status_code == 200


def test_each_conductor_syncs_only_the_hosts_the_ring_gives_it(placement, pconf, sqlite_db,
                                                               host):
    mine, theirs = f"{host}-a", f"{host}-b"
    rps = {}
    for name in (mine, theirs):
        placement.create_compute_node(name)
        rps[name] = add_accelerator(sqlite_db, name, "0000:5e:00.0")["rp"]
    sync = PlacementSync(pconf, sqlite_db)
    sync.use_ownership(Only(mine))
    result = sync.sync_once()
    assert result.written == [rps[mine]]
    assert not provider_exists(placement, rps[theirs])
    assert sync.audit_scope() == [mine]
    other = PlacementSync(pconf, sqlite_db)
    other.use_ownership(Only(theirs))
    assert other.sync_once().written == [rps[theirs]]


def test_a_host_another_conductor_is_writing_is_written_once_after_its_lease(
        placement, pconf, sqlite_db, host):
    placement.create_compute_node(host)
    rp = add_accelerator(sqlite_db, host, "0000:5e:00.0")["rp"]
    dying, taking_over = PlacementSync(pconf, sqlite_db), PlacementSync(pconf, sqlite_db)
    lease = dying.host_lease(host)
    assert lease.__enter__()  # the dying conductor holds the host, mid-write, and is killed
    result = taking_over.sync_once()
    assert result.written == [] and not provider_exists(placement, rp)
    assert sync_rows(sqlite_db, host) == {}  # nothing recorded: still to be written
    with sqlite_db.write() as conn:  # its lease lapses, by the database's clock
        conn.execute(update(leases).values(expires_at=sql_now(sqlite_db.backend, -1)))
    assert taking_over.sync_once().written == [rp]
    assert provider_exists(placement, rp)
    assert dying.sync_once().written == []  # (were it alive after all) nothing twice


def test_the_audit_repairs_a_host_only_under_its_lease(placement, pconf, sqlite_db, host):
    placement.create_compute_node(host)
    rp = add_accelerator(sqlite_db, host, "0000:5e:00.0")["rp"]
    sync, other = PlacementSync(pconf, sqlite_db), PlacementSync(pconf, sqlite_db)
    assert sync.sync_once().written == [rp]
    assert placement.delete(f"/resource_providers/{rp}").status_code == 204  # drift
    with other.host_lease(host) as held:
        assert held
        result = sync.audit([host])
        assert result.repaired == {} and not provider_exists(placement, rp)
    result = sync.audit([host])
    assert list(result.repaired) == [host] and provider_exists(placement, rp)
    with sqlite_db.read() as conn:  # the lease was given back after the repair
        assert conn.execute(leases.select()).all() == []
