"""Which Placement providers must be written again: the ``placement_sync`` flags.

Reconciliation, device enable/disable and agent liveness flag providers here, in
their own write transaction; the conductor's Placement sync writes the flagged
ones and clears the flags. Rows are upserted, so two writers flagging the same
new provider at once never collide on its primary key.
"""

from __future__ import annotations

import functools
import uuid as uuidlib
from typing import Any, Iterable

from sqlalchemy import Connection, select, update

from acceld.db.models import deployables, devices, placement_sync, utcnow

# The digest of a row whose provider's deployable is gone while consumers still hold
# allocations on it: the sync and the audit keep it, fully reserved, until it is free.
HELD = "held"


def provider_uuid(name: str) -> str:
    """The Placement provider uuid of a deployable: uuid3(NAMESPACE_DNS, name), as upstream."""
    return str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, name))


def upsert(conn: Connection, values: list[dict[str, Any]], update_cols: list[str]) -> None:
    """Insert placement_sync rows, or update ``update_cols`` of the ones that exist.

    ``values`` share their keys; they go as parameters of one statement built once per
    dialect and ``update_cols`` (SQLAlchemy sends them as one multi-row INSERT where the
    driver allows). A ``.values(rows)`` statement built per call was ~0.5 ms of a new
    node's registration, most of it building and compiling the statement."""
    if not values:
        return
    conn.execute(_upsert_statement(conn.dialect.name, tuple(update_cols)), values)


@functools.lru_cache(maxsize=None)
def _upsert_statement(dialect: str, update_cols: tuple[str, ...]) -> Any:
    if dialect == "mysql":
        from sqlalchemy.dialects.mysql import insert as my_insert

        stmt = my_insert(placement_sync)
        return stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in update_cols})
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    stmt = dialect_insert(placement_sync)
    return stmt.on_conflict_do_update(index_elements=["rp_uuid"],
                                      set_={c: stmt.excluded[c] for c in update_cols})


def flag_providers(conn: Connection, hostname: str, rp_uuids: Iterable[str]) -> None:
    """Flag these providers of ``hostname`` (new ones get a row)."""
    now = utcnow()
    upsert(conn, [{"rp_uuid": rp, "hostname": hostname, "dirty": True, "updated_at": now}
                  for rp in sorted(set(rp_uuids))], ["dirty", "hostname", "updated_at"])


def mark_dirty(conn: Connection, *, hostname: str | None = None,
               device_uuid: str | None = None) -> None:
    """Flag a host's or a device's providers for the next sync pass (call inside your write).

    Called after enabling or disabling a device, or an agent going down or coming back.
    New deployables get a row, so the pass writes them.
    """
    if hostname is None and device_uuid is None:
        raise ValueError("mark_dirty needs a hostname or a device uuid")
    query = (select(deployables.c.name, deployables.c.rp_uuid, devices.c.hostname)
             .join(devices, deployables.c.device_id == devices.c.id))
    query = query.where(devices.c.uuid == device_uuid) if device_uuid else \
        query.where(devices.c.hostname == hostname)
    now = utcnow()
    values = [{"rp_uuid": rp or provider_uuid(name), "hostname": host, "dirty": True,
               "updated_at": now}
              for name, rp, host in conn.execute(query)]
    upsert(conn, values, ["dirty", "hostname", "updated_at"])
    if hostname is not None:  # providers of deployables that are gone from the host
        conn.execute(update(placement_sync).where(placement_sync.c.hostname == hostname)
                     .values(dirty=True, updated_at=now))
