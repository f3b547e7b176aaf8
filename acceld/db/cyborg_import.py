"""`acceld db import-cyborg`: carry a stopped upstream Cyborg's database into acceld's.

Upstream's database is only read (a read-only connection; a SQLite file is opened
read-only). Everything is written into acceld's database in one transaction, which
must hold no inventory, profiles or ARQs yet: a second run is refused, naming the
import already there, and never duplicates a row. Every uuid is kept, so Nova's ARQ
uuids, Placement's provider uuids (``rp_uuid``, ``device_rp_uuid``) and the attach
handles bound instances hold mean the same afterwards.

What acceld has no column for, or holds differently, is listed by the dry run and by
the import itself (:attr:`Plan.notes`); what would make rows contradict acceld's
constraints stops the import before it writes anything (:attr:`Plan.conflicts`).
Upstream's schema, from upstream Cyborg 17's models (facts, not its code): tables
devices, controlpath_ids, deployables, attributes, attach_handles, device_profiles
(``profile_json`` = ``{"groups": [...]}``), extended_accelerator_requests (+ a
``substate`` always Initial), quota_usages and reservations; alembic's version table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sqlalchemy import (Boolean, Column, Connection, DateTime, Integer, MetaData, String,
                        Table, Text, create_engine, func, insert, inspect, select, update)
from sqlalchemy.engine import Engine, make_url

from acceld.db import accelerator_requests as arq_db
from acceld.db import bind_jobs, migrate
from acceld.db.cyborg_revisions import OLDER, SUPPORTED
from acceld.db.engine import Database, driver_message
from acceld.db.models import (accelerator_requests, attach_handles, attributes,
                              controlpath_ids, deployables, device_profiles, devices, utcnow)

# acceld's own tables an import fills: each must be empty before it.
TARGETS = (device_profiles, devices, controlpath_ids, deployables, attributes,
           attach_handles, accelerator_requests)
# Device states of upstream's NVMe cleaning that must not be offered: imported as
# maintaining (status_reason says why); available and allocated follow from the ARQs.
UNOFFERED_STATES = ("pending_cleaning", "cleaning", "error")
# Attribute keys upstream's drivers report (rc, trait*): acceld's reconciliation keeps
# them current. Any other key was created through the API and stays the operator's.
ACCELD_DEVICE_TYPES = ("GPU", "FPGA", "AICHIP", "QAT", "NIC", "SSD")
ACCELD_LIMIT = 255  # acceld's attribute keys and values are String(255); upstream's Text

_up = MetaData()


def _stamps() -> list[Column]:
    return [Column("created_at", DateTime), Column("updated_at", DateTime)]


UP = {
    "devices": Table("devices", _up, Column("id", Integer), Column("uuid", String),
                     Column("type", String), Column("vendor", String), Column("model", String),
                     Column("std_board_info", Text), Column("vendor_board_info", Text),
                     Column("hostname", String), Column("status", String),
                     Column("device_state", String), *_stamps()),
    "controlpath_ids": Table("controlpath_ids", _up, Column("id", Integer),
                             Column("uuid", String), Column("device_id", Integer),
                             Column("cpid_type", String), Column("cpid_info", String),
                             *_stamps()),
    "deployables": Table("deployables", _up, Column("id", Integer), Column("uuid", String),
                         Column("parent_id", Integer), Column("root_id", Integer),
                         Column("name", String), Column("num_accelerators", Integer),
                         Column("device_id", Integer), Column("rp_uuid", String),
                         Column("driver_name", String), Column("bitstream_id", String),
                         *_stamps()),
    "attributes": Table("attributes", _up, Column("id", Integer), Column("uuid", String),
                        Column("deployable_id", Integer), Column("key", Text),
                        Column("value", Text), *_stamps()),
    "attach_handles": Table("attach_handles", _up, Column("id", Integer),
                            Column("uuid", String), Column("deployable_id", Integer),
                            Column("cpid_id", Integer), Column("in_use", Boolean),
                            Column("attach_type", String), Column("attach_info", String),
                            *_stamps()),
    "device_profiles": Table("device_profiles", _up, Column("id", Integer),
                             Column("uuid", String), Column("name", String),
                             Column("profile_json", Text), Column("description", Text),
                             *_stamps()),
    "extended_accelerator_requests": Table(
        "extended_accelerator_requests", _up, Column("id", Integer), Column("uuid", String),
        Column("project_id", String), Column("state", String),
        Column("device_profile_id", Integer), Column("device_profile_group_id", Integer),
        Column("hostname", String), Column("device_rp_uuid", String),
        Column("instance_uuid", String), Column("attach_handle_id", Integer),
        Column("deployable_id", Integer), *_stamps()),
}
# Upstream tables acceld has nothing for: counted and named, not carried over.
NOT_CARRIED = {"quota_usages": "acceld counts a project's ARQs itself ([quota])",
               "reservations": "acceld counts a project's ARQs itself ([quota])"}


class ImportRefused(RuntimeError):
    """Nothing was written: the reason, in one line an operator acts on."""


@dataclass
class Plan:
    """What upstream holds and what the import does with it."""

    revision: str
    rows: dict[str, list[dict[str, Any]]]
    not_carried: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # carried over, but changed or odd
    conflicts: list[str] = field(default_factory=list)  # would break acceld: refuse

    def counts(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self.rows.items()}


# -- reading upstream ----------------------------------------------------------------------


def read_only_engine(url: str) -> Engine:
    """An engine on upstream's database that cannot write: a SQLite file opened read-only,
    a server session whose transactions are read-only."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if path in ("", ":memory:"):
            raise ImportRefused("--from names no SQLite file")

        def connect() -> sqlite3.Connection:
            try:
                return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            except sqlite3.OperationalError as exc:
                raise ImportRefused(f"cannot open {path} read-only: {exc}") from exc

        return create_engine("sqlite://", creator=connect)
    try:
        engine = create_engine(parsed, pool_pre_ping=True)
    except ImportError as exc:
        raise ImportRefused(driver_message(parsed, exc)) from exc
    statement = ("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"
                 if parsed.get_backend_name() == "postgresql"
                 else "SET SESSION TRANSACTION READ ONLY")

    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _read_only(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = dbapi_conn.cursor()
        cursor.execute(statement)
        cursor.close()
        if parsed.get_backend_name() == "postgresql":
            dbapi_conn.commit()

    return engine


def upstream_revision(conn: Connection) -> str:
    """Upstream's schema revision, or :class:`ImportRefused` saying what the database is."""
    names = set(inspect(conn).get_table_names())
    if "alembic_version" not in names:
        raise ImportRefused("not an upstream Cyborg database: it has no alembic_version "
                            "table (an empty database, or one `cyborg-dbsync` never ran on)")
    found = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    revision = ", ".join(found) or "(none)"
    if len(found) == 1 and found[0] in SUPPORTED:
        missing = set(UP) - names
        if missing:
            raise ImportRefused(f"the database is at upstream revision {found[0]} but lacks "
                                f"the tables {', '.join(sorted(missing))}")
        return found[0]
    if len(found) == 1 and found[0] in OLDER:
        raise ImportRefused(
            f"upstream Cyborg schema revision {revision} is older than Cyborg 17's "
            f"({', '.join(SUPPORTED)}): upgrade it with upstream's `cyborg-dbsync upgrade` "
            "first, then import")
    if found and all(rev.startswith("0") and "_" in rev for rev in found):
        raise ImportRefused(f"schema revision {revision} is acceld's own: this is already an "
                            "acceld database, not upstream Cyborg's")
    raise ImportRefused(
        f"schema revision {revision} is not one this import reads (upstream Cyborg 17: "
        f"{', '.join(SUPPORTED)}); a newer Cyborg's database needs a newer acceld")


def read(url: str) -> Plan:
    """Everything the import carries, read from upstream's database at ``url``."""
    engine = read_only_engine(url)
    try:
        with engine.connect() as conn:
            revision = upstream_revision(conn)
            rows = {name: [dict(r._mapping) for r in conn.execute(
                select(table).order_by(table.c.id))] for name, table in UP.items()}
            names = set(inspect(conn).get_table_names())
            not_carried = {name: conn.execute(select(func.count()).select_from(
                Table(name, MetaData(), Column("id", Integer)))).scalar_one()
                for name in NOT_CARRIED if name in names}
            conn.rollback()
    finally:
        engine.dispose()
    plan = Plan(revision, rows, {k: v for k, v in not_carried.items() if v})
    _review(plan)
    return plan


def _review(plan: Plan) -> None:
    """Fill ``plan.notes`` and ``plan.conflicts``."""
    rows = plan.rows
    for name, count in plan.not_carried.items():
        plan.notes.append(f"{name}: {count} row(s) not carried over ({NOT_CARRIED[name]})")
    for device in rows["devices"]:
        if device["device_state"] in UNOFFERED_STATES:
            plan.notes.append(f"device {device['uuid']} ({device['hostname']}): upstream "
                              f"device_state {device['device_state']}; imported as maintaining "
                              "(not offered) until an operator enables it")
        if device["type"] not in ACCELD_DEVICE_TYPES:
            plan.notes.append(f"device {device['uuid']}: type {device['type']} is not one of "
                              "acceld's; it keeps it until its agent reports the device")
    for name, count in Counter(d["name"] for d in rows["deployables"]).items():
        if count > 1:
            plan.conflicts.append(f"{count} deployables are named {name!r}: acceld's deployable "
                                  "names (its Placement provider names) are unique")
    seen: dict[tuple[int, str], dict] = {}
    for attr in rows["attributes"]:
        if len(attr["key"]) > ACCELD_LIMIT or len(attr["value"]) > ACCELD_LIMIT:
            plan.notes.append(f"attribute {attr['uuid']} ({attr['key'][:40]}): longer than "
                              f"{ACCELD_LIMIT} characters; not carried over")
            attr["_skip"] = True
            continue
        earlier = seen.get((attr["deployable_id"], attr["key"]))
        if earlier is not None:
            plan.notes.append(f"attributes {earlier['uuid']} and {attr['uuid']} both set "
                              f"{attr['key']!r} on one deployable: only the newer one, "
                              f"{attr['uuid']}, is carried over")
            earlier["_skip"] = True
        seen[(attr["deployable_id"], attr["key"])] = attr
    held = Counter(held_handles(rows))
    handles = {h["id"]: h for h in rows["attach_handles"]}
    freed = restarted_handles(rows)
    for handle_id, count in held.items():
        if count > 1:
            plan.conflicts.append(f"attach handle {handles[handle_id]['uuid']} is held by {count} "
                                  "accelerator requests")
    for arq in rows["extended_accelerator_requests"]:
        handle = handles.get(arq["attach_handle_id"])
        if arq["state"] == arq_db.BIND_STARTED:
            plan.notes.append(f"ARQ {arq['uuid']} (instance {arq['instance_uuid']}): its bind "
                              "was in progress; acceld's conductor binds it again and tells Nova")
        elif arq["state"] == arq_db.BOUND and handle is None:
            plan.notes.append(f"ARQ {arq['uuid']} is Bound but holds no attach handle: "
                              "`acceld status` lists it; repair as docs/arqs.md says")
        elif arq["state"] == arq_db.BOUND and not handle["in_use"]:
            plan.notes.append(f"ARQ {arq['uuid']} is Bound to attach handle {handle['uuid']}, "
                              "which upstream had not marked in use: imported in use")
    for handle in rows["attach_handles"]:
        if handle["in_use"] and handle["id"] not in held and handle["id"] not in freed:
            plan.notes.append(f"attach handle {handle['uuid']} is in use but no accelerator "
                              "request holds it: imported in use, as upstream had it")


def held_handles(rows: dict[str, list[dict[str, Any]]]) -> list[int]:
    """Upstream ids of the attach handles an ARQ holds (a bind in progress holds none:
    it restarts)."""
    return [a["attach_handle_id"] for a in rows["extended_accelerator_requests"]
            if a["attach_handle_id"] is not None and a["state"] != arq_db.BIND_STARTED]


def restarted_handles(rows: dict[str, list[dict[str, Any]]]) -> set[int]:
    """Handles only a restarting bind (BindStarted) had picked: free again in acceld."""
    return {a["attach_handle_id"] for a in rows["extended_accelerator_requests"]
            if a["attach_handle_id"] is not None
            and a["state"] == arq_db.BIND_STARTED} - set(held_handles(rows))


# -- writing acceld's ----------------------------------------------------------------------


def _target_state(conn: Connection, plan: Plan) -> None:
    """Refuse unless acceld's tables are empty, naming an earlier import of this data."""
    held = {table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in TARGETS}
    if not any(held.values()):
        return
    ours = {r["uuid"] for r in plan.rows["device_profiles"]} | {
        r["uuid"] for r in plan.rows["devices"]} | {
        r["uuid"] for r in plan.rows["extended_accelerator_requests"]}
    present = set()
    for table in (device_profiles, devices, accelerator_requests):
        present |= set(conn.execute(select(table.c.uuid)).scalars())
    what = ", ".join(f"{count} {name}" for name, count in held.items() if count)
    if ours and ours <= present:
        raise ImportRefused(f"acceld's database already holds this import ({what}); nothing "
                            "was changed")
    raise ImportRefused(f"acceld's database is not empty ({what}): the import writes only "
                        "into a database without inventory, profiles or ARQs; nothing was "
                        "changed")


def _stamped(row: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    return {"created_at": row["created_at"] or now, "updated_at": row["updated_at"]}


def _ids(conn: Connection, table: Table, uuids: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for start in range(0, len(uuids), 500):
        chunk = list(uuids[start:start + 500])
        for uuid, row_id in conn.execute(select(table.c.uuid, table.c.id).where(
                table.c.uuid.in_(chunk))):
            out[uuid] = row_id
    return out


def _insert(conn: Connection, table: Table, values: list[dict[str, Any]],
            upstream: Iterable[dict[str, Any]]) -> dict[int, int]:
    """Insert ``values`` (one per row of ``upstream``, in order); upstream id -> acceld id."""
    upstream = list(upstream)
    if not values:
        return {}
    conn.execute(insert(table), values)
    by_uuid = _ids(conn, table, [v["uuid"] for v in values])
    return {row["id"]: by_uuid[v["uuid"]] for row, v in zip(upstream, values)}


def _groups(profile_json: str) -> str:
    parsed = json.loads(profile_json)
    groups = parsed["groups"] if isinstance(parsed, dict) else parsed
    return json.dumps(groups, separators=(",", ":"))


def write(db: Database, plan: Plan) -> dict[str, int]:
    """Write ``plan`` into acceld's database in one transaction; rows written per table."""
    if plan.conflicts:
        raise ImportRefused("the upstream database has rows acceld cannot hold (nothing was "
                            "changed): " + "; ".join(plan.conflicts))
    rows = plan.rows
    now = utcnow()
    written: dict[str, int] = {}
    with db.write() as conn:
        _target_state(conn, plan)
        profiles = _insert(conn, device_profiles, [
            {"uuid": p["uuid"], "name": p["name"], "description": p["description"],
             "profile_json": _groups(p["profile_json"]), **_stamped(p, now)}
            for p in rows["device_profiles"]], rows["device_profiles"])
        device_ids = _insert(conn, devices, [
            {"uuid": d["uuid"], "type": d["type"], "vendor": d["vendor"], "model": d["model"],
             "std_board_info": d["std_board_info"], "vendor_board_info": d["vendor_board_info"],
             "hostname": d["hostname"],
             "status": "maintaining" if d["device_state"] in UNOFFERED_STATES
             else (d["status"] or "enabled"),
             "status_reason": (f"imported from upstream Cyborg in device_state "
                               f"{d['device_state']}")
             if d["device_state"] in UNOFFERED_STATES else None,
             "acc_status": "ready", "vanished": False, **_stamped(d, now)}
            for d in rows["devices"]], rows["devices"])
        cpids = _insert(conn, controlpath_ids, [
            {"uuid": c["uuid"], "device_id": device_ids[c["device_id"]],
             "cpid_type": c["cpid_type"], "cpid_info": c["cpid_info"], **_stamped(c, now)}
            for c in rows["controlpath_ids"]], rows["controlpath_ids"])
        deps = _insert(conn, deployables, [
            {"uuid": d["uuid"], "name": d["name"], "num_accelerators": d["num_accelerators"],
             "device_id": device_ids[d["device_id"]], "rp_uuid": d["rp_uuid"],
             "driver_name": d["driver_name"], "bitstream_id": d["bitstream_id"],
             **_stamped(d, now)} for d in rows["deployables"]], rows["deployables"])
        for d in rows["deployables"]:  # the tree, once every deployable has its new id
            if d["parent_id"] is not None or d["root_id"] is not None:
                conn.execute(update(deployables).where(deployables.c.id == deps[d["id"]]).values(
                    parent_id=deps.get(d["parent_id"]), root_id=deps.get(d["root_id"])))
        carried = [a for a in rows["attributes"] if not a.get("_skip")]
        _insert(conn, attributes, [
            {"uuid": a["uuid"], "deployable_id": deps[a["deployable_id"]], "key": a["key"],
             "value": a["value"], "operator_owned": not _driver_key(a["key"]),
             **_stamped(a, now)} for a in carried], carried)
        bound, freed = set(held_handles(rows)), restarted_handles(rows)
        handles = _insert(conn, attach_handles, [
            {"uuid": h["uuid"], "deployable_id": deps[h["deployable_id"]],
             "cpid_id": cpids.get(h["cpid_id"]), "attach_type": h["attach_type"],
             "attach_info": h["attach_info"],
             "in_use": h["id"] in bound or (bool(h["in_use"]) and h["id"] not in freed),
             **_stamped(h, now)}
            for h in rows["attach_handles"]], rows["attach_handles"])
        arqs = rows["extended_accelerator_requests"]
        arq_ids = _insert(conn, accelerator_requests, [_arq_values(a, profiles, handles, deps, now)
                                                       for a in arqs], arqs)
        restarted = [(arq_ids[a["id"]], a["instance_uuid"]) for a in arqs
                     if a["state"] == arq_db.BIND_STARTED]
        bind_jobs.create(conn, restarted, global_request_id=None)
        written = {table.name: conn.execute(select(func.count()).select_from(table)).scalar_one()
                   for table in TARGETS}
        written["bind_jobs"] = len(restarted)
    return written


def _driver_key(key: str) -> bool:
    return key == "rc" or key.startswith("trait")


def _arq_values(arq: dict[str, Any], profiles: dict[int, int], handles: dict[int, int],
                deps: dict[int, int], now: dt.datetime) -> dict[str, Any]:
    """One ARQ row. A bind upstream left in progress (BindStarted) restarts from scratch:
    it keeps its host, device provider and instance, holds no handle yet, and gets a bind
    job (the handle upstream may have picked is free again unless another ARQ holds it)."""
    restarting = arq["state"] == arq_db.BIND_STARTED
    return {"uuid": arq["uuid"], "state": arq["state"],
            "device_profile_id": profiles[arq["device_profile_id"]],
            "device_profile_group_id": arq["device_profile_group_id"] or 0,
            "project_id": arq["project_id"], "hostname": arq["hostname"],
            "device_rp_uuid": arq["device_rp_uuid"], "instance_uuid": arq["instance_uuid"],
            "attach_handle_id": None if restarting else handles.get(arq["attach_handle_id"]),
            "deployable_id": None if restarting else deps.get(arq["deployable_id"]),
            "bind_failure_reason": None, **_stamped(arq, now)}


# -- the command ---------------------------------------------------------------------------

LABELS = (("device_profiles", "device profiles"), ("devices", "devices"),
          ("controlpath_ids", "control paths"), ("deployables", "deployables"),
          ("attributes", "attributes"), ("attach_handles", "attach handles"),
          ("extended_accelerator_requests", "accelerator requests"))


def summary(plan: Plan) -> list[str]:
    """The dry run's and the import's report: counts, then what is not carried as it is."""
    counts = plan.counts()
    lines = [f"upstream schema revision {plan.revision} ({SUPPORTED[plan.revision]})"]
    lines += [f"  {label}: {counts[name]}" for name, label in LABELS]
    states = Counter(a["state"] for a in plan.rows["extended_accelerator_requests"])
    if states:
        lines.append("  accelerator requests by state: " + ", ".join(
            f"{state} {count}" for state, count in sorted(states.items())))
    in_use = sum(1 for h in plan.rows["attach_handles"] if h["in_use"])
    lines.append(f"  attach handles in use: {in_use}")
    if plan.notes:
        lines.append("not carried over as it is:")
        lines += [f"  - {note}" for note in plan.notes]
    if plan.conflicts:
        lines.append("cannot be imported (fix upstream's rows first):")
        lines += [f"  - {conflict}" for conflict in plan.conflicts]
    return lines


def run(url: str, db: Database | None, *, dry_run: bool) -> list[str]:
    """Read upstream at ``url``; unless ``dry_run``, write acceld's ``db``. The report.
    ``db`` None (a dry run only): acceld's database does not exist yet."""
    plan = read(url)
    lines = summary(plan)
    if dry_run:
        if db is None or (db.is_sqlite and not os.path.exists(db.url.database or "")):
            lines += ["acceld's database does not exist yet: the import creates it",
                      "dry run: nothing was changed"]
            return lines
        current = migrate.current_revision(db)
        if current == migrate.head_revision():
            with db.read() as conn:
                try:
                    _target_state(conn, plan)
                except ImportRefused as exc:
                    lines.append(f"the import would be refused: {exc}")
        else:
            lines.append(f"acceld's database is at {current or '(none: empty)'}: the import "
                         "first brings it to this release's schema")
        if plan.conflicts:
            lines.append("the import would be refused: see above")
        lines.append("dry run: nothing was changed")
        return lines
    if plan.conflicts:
        raise ImportRefused("the upstream database has rows acceld cannot hold (nothing was "
                            "changed): " + "; ".join(plan.conflicts))
    assert db is not None
    migrate.upgrade(db)
    written = write(db, plan)
    target = dict(LABELS, accelerator_requests="accelerator requests")
    lines.append("imported into acceld's database: " + ", ".join(
        f"{target[name]} {count}" for name, count in written.items() if name in target)
        + f"; binds restarted: {written['bind_jobs']}")
    return lines
