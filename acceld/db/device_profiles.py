"""Device profile queries."""

from __future__ import annotations

import uuid as uuidlib
from typing import Sequence

from sqlalchemy import Connection, Row, bindparam, delete, exists, func, or_, select

from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import device_profiles as dp
from acceld.db.models import utcnow
from acceld.db.prepared import PreparedInsert
from acceld.db.rows import driver_rows

_COLUMNS = (dp.c.id, dp.c.uuid, dp.c.name, dp.c.description, dp.c.profile_json,
            dp.c.created_at, dp.c.updated_at)


# Statements built once, with bound parameters: building one per request (literal values,
# coercions, a fresh cache key) cost more than running it.
_LIST_ALL = select(*_COLUMNS).order_by(dp.c.id)
_LIST_NAMED = _LIST_ALL.where(dp.c.name.in_(bindparam("names", expanding=True)))
_TAKEN = select(dp.c.name, dp.c.uuid).where(
    or_(dp.c.name == bindparam("name"), dp.c.uuid == bindparam("uuid"))).limit(1)
# Every profile create: compiled once per dialect (see acceld.db.prepared).
_INSERT = PreparedInsert(dp, ("uuid", "name", "description", "profile_json", "created_at",
                                "updated_at"))


def list_profiles(conn: Connection, names: Sequence[str] | None = None) -> Sequence[tuple]:
    """Driver rows in _COLUMNS order (see acceld.db.rows)."""
    if names is None:
        return driver_rows(conn, _LIST_ALL)
    return driver_rows(conn, _LIST_NAMED, {"names": list(names)})


_BY_UUID = select(*_COLUMNS).where(dp.c.uuid == bindparam("uuid"))
_BY_NAME = select(*_COLUMNS).where(dp.c.name == bindparam("name"))


def get_by_uuid(conn: Connection, uuid: str) -> Row | None:
    return conn.execute(_BY_UUID, {"uuid": uuid}).first()


def get_by_name(conn: Connection, name: str) -> Row | None:
    """Also how every ARQ create finds its profile: one prepared statement."""
    return conn.execute(_BY_NAME, {"name": name}).first()


def find(conn: Connection, idents: Sequence[str]) -> Sequence[Row]:
    """Profiles whose uuid or name is one of ``idents``."""
    return conn.execute(select(*_COLUMNS).where(
        or_(dp.c.uuid.in_(idents), dp.c.name.in_(idents)))).all()


def name_or_uuid_taken(conn: Connection, name: str, uuid: str) -> str | None:
    """'name' or 'uuid' if a profile already has it, else None."""
    row = conn.execute(_TAKEN, {"name": name, "uuid": uuid}).first()
    if row is None:
        return None
    return "name" if row.name == name else "uuid"


def create(conn: Connection, *, name: str, groups_json: str, description: str | None,
           uuid: str | None = None) -> dict:
    values = {"uuid": uuid or str(uuidlib.uuid4()), "name": name, "description": description,
              "profile_json": groups_json, "created_at": utcnow(), "updated_at": None}
    _INSERT.execute(conn, values)
    return values


def count_in_use(conn: Connection, ids: Sequence[int]) -> int:
    """How many of the profiles ``ids`` are referenced by ARQs."""
    return conn.execute(select(func.count()).select_from(dp).where(
        dp.c.id.in_(ids), exists().where(arqs.c.device_profile_id == dp.c.id))).scalar_one()


def delete_ids(conn: Connection, ids: Sequence[int]) -> None:
    conn.execute(delete(dp).where(dp.c.id.in_(ids)))
