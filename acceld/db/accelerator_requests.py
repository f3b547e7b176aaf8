"""Accelerator request (ARQ) queries and their compare-and-set state transitions.

Every state change is an ``UPDATE ... WHERE state IN (<allowed sources>)``
(:func:`transition`), following the contract's table in :data:`SOURCES`. Writers
first lock the ARQ rows they will change (:func:`lock`), always in id order, so
that the API and the conductor take locks in the same order (ARQ, then bind
job, then attach handle) and never deadlock on PostgreSQL or MariaDB; on
SQLite every write transaction holds the database write lock anyway.
"""

from __future__ import annotations

import functools
import uuid as uuidlib
from typing import Iterable, Sequence

from sqlalchemy import (Connection, Row, Select, Update, bindparam, delete, func, insert, or_,
                        select, update)

from acceld.db import bind_jobs, claims, handle_releases
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles as handles
from acceld.db.models import device_profiles as dp
from acceld.db.models import utcnow
from acceld.db.rows import driver_rows

INITIAL = "Initial"
BIND_STARTED = "BindStarted"
BOUND = "Bound"
BIND_FAILED = "BindFailed"
UNBOUND = "Unbound"
UNBIND_FAILED = "UnbindFailed"
DELETING = "Deleting"
STATES = (INITIAL, BIND_STARTED, BOUND, BIND_FAILED, UNBOUND, UNBIND_FAILED, DELETING)
RESOLVED = frozenset({BOUND, BIND_FAILED, DELETING})

# target state <- the states it may be entered from (the contract's table).
SOURCES: dict[str, tuple[str, ...]] = {
    BIND_STARTED: (INITIAL, UNBOUND),
    BOUND: (BIND_STARTED,),
    BIND_FAILED: (BIND_STARTED, BOUND),
    UNBOUND: (INITIAL, BIND_STARTED, BOUND, BIND_FAILED),
    DELETING: tuple(s for s in STATES if s != DELETING),
}

# What an API response needs, in one query: the ARQ, its profile's name, its handle.
_WIRE_COLUMNS = (
    arqs.c.id, arqs.c.uuid, arqs.c.state, dp.c.name.label("device_profile_name"),
    arqs.c.device_profile_group_id, arqs.c.hostname, arqs.c.device_rp_uuid,
    arqs.c.instance_uuid, arqs.c.project_id, arqs.c.bind_failure_reason,
    handles.c.uuid.label("attach_handle_uuid"), handles.c.attach_type.label("attach_handle_type"),
    handles.c.attach_info.label("attach_handle_info"), arqs.c.created_at, arqs.c.updated_at,
    arqs.c.consumer_uuid,
)
WIRE_FIELDS = tuple(c.name for c in _WIRE_COLUMNS)
_WIRE_FROM = arqs.join(dp, dp.c.id == arqs.c.device_profile_id).outerjoin(
    handles, handles.c.id == arqs.c.attach_handle_id)

# What a writer needs to decide on an ARQ, read under a row lock.
_LOCK_COLUMNS = (arqs.c.id, arqs.c.uuid, arqs.c.state, arqs.c.project_id,
                 arqs.c.instance_uuid, arqs.c.attach_handle_id, arqs.c.consumer_uuid)


def _wire_query():  # type: ignore[no-untyped-def]
    return select(*_WIRE_COLUMNS).select_from(_WIRE_FROM)


def list_arqs(conn: Connection, *, project_id: str | None = None,
              instance_uuid: str | None = None, after_id: int | None = None,
              limit: int | None = None) -> Sequence[tuple]:
    """ARQs for the API, oldest first (by id); ``project_id`` None means every project
    (admins). A page: ``after_id`` (the marker's id) and at most ``limit`` rows."""
    query = _wire_query().order_by(arqs.c.id)
    if project_id is not None:
        query = query.where(arqs.c.project_id == project_id)
    if instance_uuid is not None:
        query = query.where(arqs.c.instance_uuid == instance_uuid)
    if after_id is not None:
        query = query.where(arqs.c.id > after_id)
    if limit is not None:
        query = query.limit(limit)
    # Driver tuples in WIRE_FIELDS order: no per-value processing for 1,000 rows.
    return driver_rows(conn, query)


def id_of(conn: Connection, uuid: str, project_id: str | None = None) -> int | None:
    """The id of an ARQ the caller may see (a page marker), or None."""
    query = select(arqs.c.id).where(arqs.c.uuid == uuid)
    if project_id is not None:
        query = query.where(arqs.c.project_id == project_id)
    return conn.execute(query).scalar()


# Every create runs it: compiled once per dialect and run as driver SQL, which costs a
# third of building and executing the statement each time (acceld.db.prepared's reason).
_COUNT_OF_PROJECT = select(func.count()).select_from(arqs).where(
    arqs.c.project_id == bindparam("project_id"))
_COUNT_OF_NO_PROJECT = select(func.count()).select_from(arqs).where(arqs.c.project_id.is_(None))
_count_sql: dict[tuple[str, str, bool], tuple[str, bool]] = {}


def count_for_project(conn: Connection, project_id: str | None) -> int:
    """How many ARQs a project holds, in every state (its usage against its limit)."""
    dialect = conn.dialect
    key = (dialect.name, dialect.driver, project_id is None)
    plan = _count_sql.get(key)
    if plan is None:
        compiled = (_COUNT_OF_NO_PROJECT if project_id is None else _COUNT_OF_PROJECT).compile(
            dialect=dialect)
        plan = _count_sql[key] = (compiled.string, bool(compiled.positional))
    sql, positional = plan
    if project_id is None:
        params: tuple | dict = () if positional else {}
    else:
        params = (project_id,) if positional else {"project_id": project_id}
    return conn.exec_driver_sql(sql, params).scalar_one()


def get_by_uuid(conn: Connection, uuid: str, project_id: str | None = None) -> Row | None:
    query = _wire_query().where(arqs.c.uuid == uuid)
    if project_id is not None:
        query = query.where(arqs.c.project_id == project_id)
    return conn.execute(query).first()


def create_many(conn: Connection, *, profile_id: int, group_ids: Sequence[int],
                project_id: str | None) -> list[dict]:
    """Insert one Initial ARQ per entry of ``group_ids`` in one statement; return their values."""
    now = utcnow()
    rows = [{"uuid": str(uuidlib.uuid4()), "state": INITIAL, "device_profile_id": profile_id,
             "device_profile_group_id": group, "project_id": project_id, "hostname": None,
             "device_rp_uuid": None, "instance_uuid": None, "attach_handle_id": None,
             "deployable_id": None, "bind_failure_reason": None, "created_at": now,
             "updated_at": None} for group in group_ids]
    if rows:
        conn.execute(insert(arqs), rows)
    return rows


def lock(conn: Connection, *, uuids: Iterable[str] | None = None,
         instance_uuid: str | None = None, project_id: str | None = None) -> Sequence[Row]:
    """The ARQs a write is about, locked until the transaction ends (FOR UPDATE; SQLite
    holds the whole database for a write), in id order."""
    query = _lock_query(uuids is not None, instance_uuid is not None, project_id is not None)
    return conn.execute(query, {"uuids": list(uuids or ()), "instance": instance_uuid,
                                "project": project_id}).all()


@functools.lru_cache(maxsize=8)
def _lock_query(by_uuids: bool, by_instance: bool, by_project: bool) -> Select:
    """:func:`lock`'s statement for one combination of filters, built once."""
    query = select(*_LOCK_COLUMNS).order_by(arqs.c.id).with_for_update()
    if by_uuids:
        query = query.where(arqs.c.uuid.in_(bindparam("uuids", expanding=True)))
    if by_instance:
        query = query.where(arqs.c.instance_uuid == bindparam("instance"))
    if by_project:
        query = query.where(arqs.c.project_id == bindparam("project"))
    return query


def lock_one_by_id(conn: Connection, arq_id: int) -> "_Bindable | None":
    """One ARQ with its profile groups (JSON text), the ARQ row locked: what a bind needs.

    Two statements, so that only the ARQ row is locked, never the shared profile row.
    """
    arq = conn.execute(_LOCK_FOR_BIND, {"id": arq_id}).first()
    if arq is None:
        return None
    profile = conn.execute(_PROFILE_FOR_BIND, {"id": arq.device_profile_id}).one()
    return _Bindable(arq, profile.name, profile.profile_json)


# Built once: every bind runs them (building them cost about as much as running them).
_LOCK_FOR_BIND = select(
    arqs.c.id, arqs.c.uuid, arqs.c.state, arqs.c.hostname, arqs.c.device_rp_uuid,
    arqs.c.instance_uuid, arqs.c.project_id, arqs.c.device_profile_id,
    arqs.c.device_profile_group_id, arqs.c.attach_handle_id, arqs.c.consumer_uuid).where(
    arqs.c.id == bindparam("id")).with_for_update()
_PROFILE_FOR_BIND = select(dp.c.name, dp.c.profile_json).where(dp.c.id == bindparam("id"))


class _Bindable:
    """An ARQ row plus its profile's name and groups."""

    def __init__(self, arq: Row, profile_name: str, profile_json: str) -> None:
        self.__dict__.update(arq._mapping)
        self.device_profile_name = profile_name
        self.profile_json = profile_json


def transition(conn: Connection, ids: Sequence[int], target: str, **values: object) -> int:
    """Compare-and-set: move ``ids`` to ``target`` from the states the contract allows.

    Returns how many rows moved; the caller decides whether fewer than asked is a conflict.
    """
    if not ids:
        return 0
    statement = _transition_statement(target, tuple(sorted(values)))
    return conn.execute(statement, {"ids": list(ids), "now": utcnow(),
                                    **{f"v_{k}": v for k, v in values.items()}}).rowcount


@functools.lru_cache(maxsize=32)
def _transition_statement(target: str, columns: tuple[str, ...]) -> Update:
    """:func:`transition`'s UPDATE for one target state and set of columns, built once."""
    return update(arqs).where(
        arqs.c.id.in_(bindparam("ids", expanding=True)),
        arqs.c.state.in_(SOURCES[target])).values(
        state=target, updated_at=bindparam("now"),
        **{column: bindparam(f"v_{column}") for column in columns})


_START_BINDS = update(arqs).where(
    arqs.c.id == bindparam("b_id"),
    # OR, not IN: an expanding IN cannot run as executemany.
    or_(*(arqs.c.state == s for s in SOURCES[BIND_STARTED]))).values(
    state=BIND_STARTED, hostname=bindparam("b_hostname"),
    device_rp_uuid=bindparam("b_rp"), instance_uuid=bindparam("b_instance"),
    project_id=bindparam("b_project"), attach_handle_id=None, deployable_id=None,
    bind_failure_reason=None, updated_at=bindparam("b_now"))


def start_binds(conn: Connection, binds: Sequence[dict]) -> int:
    """Initial/Unbound -> BindStarted with each ARQ's own binding fields (one executemany).

    ``binds``: dicts with ``id``, ``hostname``, ``device_rp_uuid``, ``instance_uuid`` and
    ``project_id``. Returns the rows moved when the driver can count them, else -1.
    """
    if not binds:
        return 0
    now = utcnow()
    params = [{"b_id": b["id"], "b_hostname": b["hostname"], "b_rp": b["device_rp_uuid"],
               "b_instance": b["instance_uuid"], "b_project": b["project_id"], "b_now": now}
              for b in binds]
    result = conn.execute(_START_BINDS, params)
    return result.rowcount if conn.dialect.supports_sane_multi_rowcount else -1


def release_handles(conn: Connection, handle_ids: Iterable[int | None]) -> int:
    """Give the attach handles back (the ARQs holding them are locked by the caller): free
    at once, or, for a handle with a host step, queued for the conductor to release on its
    node first (acceld.db.handle_releases). Returns how many were freed or queued."""
    freed, queued = handle_releases.give_back(conn, handle_ids)
    return freed + queued


def unbind(conn: Connection, rows: Sequence[Row]) -> int:
    """Unbind locked ARQs: free their handles, drop their bind jobs, clear the binding."""
    ids = [r.id for r in rows]
    if not ids:  # a PATCH that only binds: no statement at all
        return 0
    release_handles(conn, (r.attach_handle_id for r in rows))
    conn.execute(bind_jobs.DELETE_OF_ARQS, {"arq_ids": ids})
    claims.mark_due(conn, (r.consumer_uuid for r in rows))
    return transition(conn, ids, UNBOUND, hostname=None, device_rp_uuid=None,
                      instance_uuid=None, attach_handle_id=None, deployable_id=None,
                      bind_failure_reason=None)


def delete_locked(conn: Connection, rows: Sequence[Row]) -> int:
    """Delete locked ARQs: the Deleting compare-and-set first (the claim), then free their
    handles, drop their bind jobs and remove the rows, all in the caller's transaction."""
    ids = [r.id for r in rows]
    if not ids:
        return 0
    transition(conn, ids, DELETING)
    release_handles(conn, (r.attach_handle_id for r in rows))
    conn.execute(bind_jobs.DELETE_OF_ARQS, {"arq_ids": ids})
    # A standalone claim's allocation goes with it: its consumer is written again by a
    # conductor (acceld.conductor.placement.claim_allocations), however often one crashes first.
    claims.mark_due(conn, (r.consumer_uuid for r in rows))
    return conn.execute(_DELETE_ARQS, {"ids": ids}).rowcount


_DELETE_ARQS = delete(arqs).where(arqs.c.id.in_(bindparam("ids", expanding=True)))
