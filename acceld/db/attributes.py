"""Attribute queries: key/value facts about deployables (``rc``, ``trait<N>``, ...)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Sequence

from sqlalchemy import Connection, Row, delete, insert, select

from acceld.db import placement_flags
from acceld.db.models import attributes, deployables, devices, utcnow

_COLUMNS = (attributes.c.id, attributes.c.uuid, attributes.c.deployable_id, attributes.c.key,
            attributes.c.value, attributes.c.created_at, attributes.c.updated_at)

FILTERS = ("deployable_id", "key")


def list_attributes(conn: Connection, filters: dict[str, object]) -> Sequence[Row]:
    query = select(*_COLUMNS).order_by(attributes.c.id)
    for name in FILTERS:
        if name in filters:
            query = query.where(attributes.c[name] == filters[name])
    return conn.execute(query).all()


def get_by_uuid(conn: Connection, uuid: str) -> Row | None:
    return conn.execute(select(*_COLUMNS).where(attributes.c.uuid == uuid)).first()


def deployable_exists(conn: Connection, deployable_id: int) -> bool:
    return conn.execute(select(deployables.c.id).where(
        deployables.c.id == deployable_id)).first() is not None


def taken(conn: Connection, deployable_id: int, key: str, uuid: str) -> str | None:
    """'key' if the deployable already has ``key``, 'uuid' if ``uuid`` is used, else None."""
    row = conn.execute(select(attributes.c.deployable_id, attributes.c.key).where(
        ((attributes.c.deployable_id == deployable_id) & (attributes.c.key == key))
        | (attributes.c.uuid == uuid)).limit(1)).first()
    if row is None:
        return None
    return "key" if (row.deployable_id, row.key) == (deployable_id, key) else "uuid"


def create(conn: Connection, *, deployable_id: int, key: str, value: str,
           uuid: str | None = None) -> dict:
    """An operator's attribute (the API's create): reconciliation leaves it alone until the
    deployable's driver reports the same key (docs/devices.md)."""
    values = {"uuid": uuid or str(uuidlib.uuid4()), "deployable_id": deployable_id, "key": key,
              "value": value, "operator_owned": True, "created_at": utcnow(),
              "updated_at": None}
    values["id"] = conn.execute(insert(attributes).values(values)).inserted_primary_key[0]
    flag_if_placement(conn, deployable_id, key)
    return values


def delete_by_uuid(conn: Connection, uuid: str) -> bool:
    row = conn.execute(select(attributes.c.deployable_id, attributes.c.key).where(
        attributes.c.uuid == uuid)).first()
    if row is None:
        return False
    conn.execute(delete(attributes).where(attributes.c.uuid == uuid))
    flag_if_placement(conn, row.deployable_id, row.key)
    return True


def flag_if_placement(conn: Connection, deployable_id: int, key: str) -> None:
    """``rc`` and ``trait*`` are what Placement shows of a deployable: flag its provider so
    that the conductor's Placement sync writes the change."""
    if key != "rc" and not key.startswith("trait"):
        return
    dep = conn.execute(select(deployables.c.name, deployables.c.rp_uuid, devices.c.hostname)
                       .join(devices, devices.c.id == deployables.c.device_id)
                       .where(deployables.c.id == deployable_id)).first()
    if dep is not None:
        placement_flags.flag_providers(conn, dep.hostname,
                                       [dep.rp_uuid or placement_flags.provider_uuid(dep.name)])
