"""Device profile queries."""

from __future__ import annotations

import uuid as uuidlib
from typing import Sequence

from sqlalchemy import Connection, Row, delete, exists, func, insert, or_, select

from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import device_profiles as dp
from acceld.db.models import utcnow

_COLUMNS = (dp.c.id, dp.c.uuid, dp.c.name, dp.c.description, dp.c.profile_json,
            dp.c.created_at, dp.c.updated_at)


def list_profiles(conn: Connection, names: Sequence[str] | None = None) -> Sequence[Row]:
    query = select(*_COLUMNS).order_by(dp.c.id)
    if names is not None:
        query = query.where(dp.c.name.in_(names))
    return conn.execute(query).all()


def get_by_uuid(conn: Connection, uuid: str) -> Row | None:
    return conn.execute(select(*_COLUMNS).where(dp.c.uuid == uuid)).first()


def get_by_name(conn: Connection, name: str) -> Row | None:
    return conn.execute(select(*_COLUMNS).where(dp.c.name == name)).first()


def find(conn: Connection, idents: Sequence[str]) -> Sequence[Row]:
    """Profiles whose uuid or name is one of ``idents``."""
    return conn.execute(select(*_COLUMNS).where(
        or_(dp.c.uuid.in_(idents), dp.c.name.in_(idents)))).all()


def name_or_uuid_taken(conn: Connection, name: str, uuid: str) -> str | None:
    """'name' or 'uuid' if a profile already has it, else None."""
    row = conn.execute(select(dp.c.name, dp.c.uuid).where(
        or_(dp.c.name == name, dp.c.uuid == uuid)).limit(1)).first()
    if row is None:
        return None
    return "name" if row.name == name else "uuid"


def create(conn: Connection, *, name: str, groups_json: str, description: str | None,
           uuid: str | None = None) -> dict:
    values = {"uuid": uuid or str(uuidlib.uuid4()), "name": name, "description": description,
              "profile_json": groups_json, "created_at": utcnow(), "updated_at": None}
    conn.execute(insert(dp).values(values))
    return values


def count_in_use(conn: Connection, ids: Sequence[int]) -> int:
    """How many of the profiles ``ids`` are referenced by ARQs."""
    return conn.execute(select(func.count()).select_from(dp).where(
        dp.c.id.in_(ids), exists().where(arqs.c.device_profile_id == dp.c.id))).scalar_one()


def delete_ids(conn: Connection, ids: Sequence[int]) -> None:
    conn.execute(delete(dp).where(dp.c.id.in_(ids)))
