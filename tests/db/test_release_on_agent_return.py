"""A release that waited out its agent's outage runs as soon as the agent is back.

Without this, a release whose agent was down kept its backoff (2, 4, ... up to 300 s) after
the agent's hello, and the handle stayed in use for up to five minutes more.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import insert, select, update

from acceld.db import agents as agents_db
from acceld.db.models import agents, handle_releases, utcnow
from tests.support import inventory

LATER = dt.timedelta(minutes=4)


def _queue(db, hostname: str, owner: str | None) -> int:  # type: ignore[no-untyped-def]
    with db.write() as conn:
        device = inventory.add_device(conn, hostname=hostname)
        dep = inventory.add_deployable(conn, device["id"], name=f"{hostname}_{owner}")
        [handle] = inventory.add_attach_handles(conn, dep["id"], 1, in_use=True)
        handle_id = handle["id"]
        return conn.execute(insert(handle_releases).values(
            attach_handle_id=handle_id, hostname=hostname, driver_name="fake",
            lease_owner=owner, lease_expires_at=utcnow() + LATER, attempts=3,
            last_error="agent unreachable", created_at=utcnow())).inserted_primary_key[0]


def _expiry(db, release_id: int):  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(handle_releases.c.lease_expires_at).where(
            handle_releases.c.id == release_id)).scalar_one()


def _beat(db, hostname: str, endpoint: str = "127.0.0.1:6668") -> None:  # type: ignore[no-untyped-def]
    with db.write() as conn:
        agents_db.record_heartbeat(conn, hostname, endpoint, 10)


def test_an_agent_back_from_down_makes_its_waiting_releases_due(db) -> None:
    _beat(db, "node1")
    _beat(db, "node2")
    waiting, in_flight = _queue(db, "node1", None), _queue(db, "node1", "conductor-x")
    elsewhere = _queue(db, "node2", None)
    _beat(db, "node1")  # steady: nothing changes
    assert _expiry(db, waiting) is not None
    with db.write() as conn:
        conn.execute(update(agents).where(agents.c.hostname == "node1").values(state="down"))
    _beat(db, "node1")
    assert _expiry(db, waiting) is None  # due now
    assert _expiry(db, in_flight) is not None  # its conductor still holds it
    assert _expiry(db, elsewhere) is not None  # another host's


def test_a_restarted_agent_makes_its_waiting_releases_due(db) -> None:
    _beat(db, "node1")
    waiting = _queue(db, "node1", None)
    _beat(db, "node1", "127.0.0.1:7777")  # a new agent process, never marked down
    assert _expiry(db, waiting) is None
