"""A node's inventory in the database, and the diff that brings it in line with a report.

``reconcile_node`` compares the records one node reports with the rows that
node has: devices by control path, deployables by name, attributes by key,
attach handles by attach info, and a handle whose info changed by what it names (an mdev,
a PCI function: acceld.db.handle_identity). It writes only the differences, inside the
caller's transaction (so a node's adds, updates and removals commit
together), and an unchanged node costs five SELECTs and no write.

Rows in use are never pulled from under an instance: a device that
disappears while one of its attach handles is in use stays, ``maintaining``
and ``vanished`` with a reason, until the handle is released; a later
reconcile then removes it. The same holds for a deployable or a handle that
disappears while in use (a deployable kept so loses its free handles at once:
no new bind may take hardware the node no longer has).

The diff is computed from a read, and a bind on another connection may take
a handle between that read and the writes (PostgreSQL and MariaDB run both at
once; SQLite's write lock serialises them). So a removal never trusts the read
alone: before removing a device or a deployable it locks the device row
(``FOR UPDATE``), then the handles, and reads ``in_use`` as committed now; a
handle is deleted only ``WHERE in_use = false``. A bind locks the device row
(``FOR SHARE``) before it takes a handle (acceld.conductor.binding.target), so
either the bind commits first and the removal sees the handle in use, or the
removal commits first and the bind finds no device. Locks follow one order,
device (through its ``uuid`` index, then the row: MariaDB locks index entries) then
handles, in both.
"""

from __future__ import annotations

import json
import logging
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson
from sqlalchemy import (Connection, delete, false, insert, literal_column, select, union_all,
                        update)

from acceld.db import bulk
from acceld.db import device_events as events
from acceld.db import fences
from acceld.db import handle_identity
from acceld.db import placement_flags
from acceld.db.placement_flags import provider_uuid as rp_uuid
from acceld.db.models import (attach_handles, attributes, controlpath_ids, deployables,
                              device_events, devices)
from acceld.drivers.base import HardwareRecord, needs_attach_step
from acceld.drivers.record_schema import identity, json_text

LOG = logging.getLogger(__name__)

VANISHED_PREFIX = "Hardware vanished"
VANISHED_REASON = (VANISHED_PREFIX + " from its node while an attach handle is in use; "
                   "held until released, then removed.")


def deployable_name(hostname: str, local_name: str) -> str:
    return f"{hostname}_{local_name}"


def board_text(value: dict[str, Any] | str) -> str:
    """Board info as stored and shown: JSON text for an object (spaced as upstream's), a
    plain string as is."""
    return value if isinstance(value, str) else json.dumps(value)


def not_ready_reason(record: HardwareRecord) -> str | None:
    if record.acc_status == "ready":
        return None
    return record.status_reason or f"The hardware reports {record.acc_status}."


@dataclass
class Changes:
    """What one reconcile did, for the log and the tests."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    held: list[str] = field(default_factory=list)  # uuids of devices kept because in use
    skipped: list[str] = field(default_factory=list)
    dirty_rps: set[str] = field(default_factory=set)
    # (row as the diff read it, or None if added; device id; record) per reported device,
    # for the health rules applied after the diff (acceld.quarantine).
    reported: list[tuple[Any, int, HardwareRecord]] = field(default_factory=list)
    # Device id -> the row as inserted by this transaction (its columns as written, the
    # models' defaults for the rest): the health rules need not lock or read it again.
    inserted: dict[int, Any] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return self.added + self.updated + self.removed

    def __str__(self) -> str:
        return (f"{self.added} added, {self.updated} updated, {self.removed} removed, "
                f"{len(self.held)} held in use")


@dataclass
class _Node:
    """The rows one node has now, keyed the way the diff matches them."""

    devices: dict[str, Any]  # control path identity -> device row
    cpid_of: dict[int, Any]  # device id -> controlpath row
    deployables: dict[str, Any]  # full name -> row
    deps_of: dict[int, list[Any]]  # device id -> deployable rows
    attrs_of: dict[int, dict[str, Any]]  # deployable id -> key -> row
    handles_of: dict[int, dict[str, Any]]  # deployable id -> attach identity -> row
    # Rows to add, written once for the whole node after its devices are diffed (one
    # statement each instead of one per deployable: acceld.db.bulk).
    new_attributes: list[dict[str, Any]] = field(default_factory=list)
    new_handles: list[dict[str, Any]] = field(default_factory=list)
    added_deployables: dict[str, int] = field(default_factory=dict)  # full name -> new id


def _path_key(cpid_type: str, info: dict[str, Any]) -> str:
    return cpid_type + identity(info)


def _handle_key(attach_type: str, info: dict[str, Any]) -> str:
    return attach_type + identity(info)


def load_node(conn: Connection, hostname: str) -> _Node:
    """Five queries, however big the node (one for a node without devices).

    Each query names the ids the previous one found rather than a subquery of the
    host's devices: a subquery's plan depends on the tables' statistics, and right
    after a bulk registration (or where autovacuum does not run) PostgreSQL's were
    stale, so it joined by scanning every row of every node: 15 ms per query at
    10,000 nodes, the most of a reconcile. An id list is an index lookup whatever the
    statistics say.
    """
    dev_rows = conn.execute(select(devices).where(devices.c.hostname == hostname)).all()
    device_ids = [row.id for row in dev_rows]
    cpid_rows: list[Any] = []
    dep_rows: list[Any] = []
    attr_rows: list[Any] = []
    handle_rows: list[Any] = []
    if device_ids:
        cpid_rows = conn.execute(select(controlpath_ids).where(
            controlpath_ids.c.device_id.in_(device_ids))).all()
        dep_rows = conn.execute(select(deployables).where(
            deployables.c.device_id.in_(device_ids))).all()
    dep_ids = [row.id for row in dep_rows]
    if dep_ids:
        attr_rows = conn.execute(select(attributes).where(
            attributes.c.deployable_id.in_(dep_ids))).all()
        handle_rows = conn.execute(select(attach_handles).where(
            attach_handles.c.deployable_id.in_(dep_ids))).all()

    by_id = {row.id: row for row in dev_rows}
    node = _Node({}, {}, {}, {}, {}, {})
    for row in cpid_rows:
        node.cpid_of[row.device_id] = row
        node.devices[_path_key(row.cpid_type, orjson.loads(row.cpid_info))] = by_id[row.device_id]
    for row in dep_rows:
        node.deployables[row.name] = row
        node.deps_of.setdefault(row.device_id, []).append(row)
    for row in attr_rows:
        node.attrs_of.setdefault(row.deployable_id, {})[row.key] = row
    for row in handle_rows:
        key = _handle_key(row.attach_type, orjson.loads(row.attach_info))
        node.handles_of.setdefault(row.deployable_id, {})[key] = row
    return node


def reconcile_node(conn: Connection, hostname: str, records: Iterable[HardwareRecord], *,
                   keep_drivers: set[str] | None = None, keep_all: bool = False) -> Changes:
    """Make ``hostname``'s rows match ``records``, in the caller's transaction.

    Devices not reported are removed, except those of a driver in ``keep_drivers``
    (or all, with ``keep_all``): what a refused record described stays as it was.
    """
    records = list(records)
    node = load_node(conn, hostname)
    changes = Changes()
    reported: set[str] = set()
    taken = _taken_identities(conn, node, records, hostname)
    rows = [node.devices.get(_path_key(r.controlpath_id["cpid_type"],
                                       r.controlpath_id["cpid_info"])) for r in records]
    # New devices and deployables are inserted first, one statement each for the node (their
    # ids come back in the rows' order); only new rows, which no one else sees yet.
    new_ids = iter(_add_devices(conn, hostname, [r for r, row in zip(records, rows)
                                                 if row is None], changes, taken))
    device_ids = [next(new_ids) if row is None else row.id for row in rows]
    _add_deployables(conn, hostname, list(zip(device_ids, records)), node, changes, taken)
    for record, row, device_id in zip(records, rows, device_ids):
        reported.add(_path_key(record.controlpath_id["cpid_type"],
                               record.controlpath_id["cpid_info"]))
        if row is not None:
            _update_device(conn, row, record, node, changes)
        _sync_deployables(conn, hostname, device_id, record, node, changes)
        changes.reported.append((row, device_id, record))
    _insert_new_rows(conn, node)
    for key, row in node.devices.items():
        if key in reported:
            continue
        drivers = {d.driver_name for d in node.deps_of.get(row.id, [])}
        if keep_all or (keep_drivers and drivers & keep_drivers):
            continue
        _remove_device(conn, row, node, changes)
    if changes.dirty_rps:
        placement_flags.flag_providers(conn, hostname, changes.dirty_rps)
    return changes


def _insert_new_rows(conn: Connection, node: _Node) -> None:
    """The attributes and attach handles the diff added, one statement each for the node."""
    bulk.insert_rows(conn, attributes, node.new_attributes)
    _fresh_uuids_where_taken(conn, node.new_handles)
    if node.new_handles:  # a handle discovered again goes on above its old row's tokens
        first = fences.first_token(conn)
        for row in node.new_handles:
            row["fence_token"] = first
    bulk.insert_rows(conn, attach_handles, node.new_handles)


@dataclass
class _Taken:
    device_uuids: set[str]
    deployable_names: set[str]
    with_history: set[str] = field(default_factory=set)  # new uuids with device events


@dataclass
class InsertedDevice:
    """A device row this transaction inserted, as the health rules read one."""

    id: int
    uuid: str
    hostname: str
    health: str = "unknown"
    health_reason: str | None = None
    health_ok_reports: int = 0
    quarantined: bool = False


def _taken_identities(conn: Connection, node: _Node, records: list[HardwareRecord],
                      hostname: str) -> _Taken:
    """Uuids and names that new rows would collide with elsewhere, and which new devices
    come back with a history: one statement for the node (a UNION ALL of the lookups it
    needs), only when it has new rows. Three statements cost a new node ~0.6 ms more of
    the conductor's CPU, most of it SQLAlchemy's and the driver's per-statement work."""
    new = [r for r in records if _path_key(r.controlpath_id["cpid_type"],
                                           r.controlpath_id["cpid_info"]) not in node.devices]
    new_names = {deployable_name(hostname, d.name) for r in records for d in r.deployables
                 } - set(node.deployables)
    taken = _Taken(set(), set())
    lookups = []
    if new:
        uuids = [str(uuidlib.UUID(r.uuid)) for r in new]
        lookups.append(select(_KIND_DEVICE, devices.c.uuid.label("value")).where(
            devices.c.uuid.in_([r.uuid for r in new])))
        lookups.append(select(_KIND_HISTORY, device_events.c.device_uuid.label("value")).where(
            device_events.c.device_uuid.in_(uuids)))
    if new_names:
        lookups.append(select(_KIND_NAME, deployables.c.name.label("value")).where(
            deployables.c.name.in_(sorted(new_names))))
    if not lookups:
        return taken
    found = {"device": taken.device_uuids, "history": taken.with_history,
             "name": taken.deployable_names}
    statement = lookups[0] if len(lookups) == 1 else union_all(*lookups)
    for kind, value in conn.execute(statement):
        found[kind].add(value)
    return taken


_KIND_DEVICE, _KIND_HISTORY, _KIND_NAME = (literal_column(f"'{kind}'").label("kind")
                                           for kind in ("device", "history", "name"))


def _device_values(record: HardwareRecord) -> dict[str, Any]:
    return {
        "type": record.type,
        "vendor": record.vendor,
        "model": record.model,
        "std_board_info": board_text(record.std_board_info),
        "vendor_board_info": board_text(record.vendor_board_info),
        "acc_status": record.acc_status,
    }


_RETURNING_IDS = {table.name: insert(table).returning(table.c.id, sort_by_parameter_order=True)
                  for table in (devices, deployables)}


def _insert_ids(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> list[int]:
    """Insert ``rows`` and return their ids in the same order: one statement where the
    database returns ids in parameter order (SQLite, PostgreSQL, MariaDB 10.5+), else one
    per row. A cached statement with parameters, never a .values() statement per row
    (building and compiling one cost ~0.1 ms)."""
    if not rows:
        return []
    if conn.dialect.insert_executemany_returning_sort_by_parameter_order:
        return list(conn.execute(_RETURNING_IDS[table.name], rows).scalars())
    return [conn.execute(insert(table), row).inserted_primary_key[0] for row in rows]


def _add_devices(conn: Connection, hostname: str, records: list[HardwareRecord],
                 changes: Changes, taken: _Taken) -> list[int]:
    """Insert the node's new devices and their control paths; their ids, in order."""
    uuids = []
    for record in records:
        uuid = str(uuidlib.UUID(record.uuid))
        if uuid in taken.device_uuids:
            LOG.warning("Hardware uuid %s reported by %s is already used by another device; "
                        "the new device gets a fresh uuid", uuid, hostname)
            uuid = str(uuidlib.uuid4())
        uuids.append(uuid)
    ids = _insert_ids(conn, devices, [dict(
        uuid=uuid, hostname=hostname, status="enabled", status_reason=not_ready_reason(record),
        vanished=False, **_device_values(record)) for uuid, record in zip(uuids, records)])
    if ids:
        bulk.insert_rows(conn, controlpath_ids, [dict(
            uuid=str(uuidlib.uuid4()), device_id=device_id,
            cpid_type=record.controlpath_id["cpid_type"],
            cpid_info=json_text(record.controlpath_id["cpid_info"]))
            for device_id, record in zip(ids, records)])
    for device_id, uuid in zip(ids, uuids):
        changes.added += 1
        changes.inserted[device_id] = InsertedDevice(device_id, uuid, hostname)
        if uuid in taken.with_history:
            # A device with a history came back (removed while it was not reported).
            events.record(conn, uuid, hostname, events.REAPPEARED,
                          f"Reported again by host {hostname}")
    return ids


def _add_deployables(conn: Connection, hostname: str,
                     plan: list[tuple[int, HardwareRecord]], node: _Node, changes: Changes,
                     taken: _Taken) -> None:
    """Insert every reported deployable the node lacks (``node.added_deployables``),
    except those whose name another node holds."""
    names, rows = [], []
    first = None
    for device_id, record in plan:
        for dep in record.deployables:
            name = deployable_name(hostname, dep.name)
            if name in node.deployables:
                continue
            if name in taken.deployable_names:
                LOG.warning("Deployable %s reported by %s already exists on another node; "
                            "not added", name, hostname)
                changes.skipped.append(name)
                continue
            names.append(name)
            # A device discovered again goes on above every token of its earlier rows.
            first = fences.first_token(conn) if first is None else first
            rows.append(dict(
                uuid=str(uuidlib.uuid4()), name=name, num_accelerators=dep.num_accelerators,
                device_id=device_id, driver_name=record.driver_name, rp_uuid=rp_uuid(name),
                bitstream_id=dep.bitstream_id, fence_token=first, fence_told=None))
    for name, dep_id in zip(names, _insert_ids(conn, deployables, rows)):
        node.added_deployables[name] = dep_id
        changes.added += 1
        changes.dirty_rps.add(rp_uuid(name))


def _update_device(conn: Connection, row: Any, record: HardwareRecord, node: _Node,
                   changes: Changes) -> None:
    values = {k: v for k, v in _device_values(record).items() if getattr(row, k) != v}
    status, reason = row.status, row.status_reason
    if row.vanished:
        values["vanished"] = False
        events.record(conn, row.uuid, row.hostname, events.REAPPEARED,
                      f"Reported again by host {row.hostname}")
        if (reason or "").startswith(VANISHED_PREFIX):
            status, reason = "enabled", None
            values["status"] = status
    if status == "enabled":
        # The reason shown on an enabled device is the hardware's own (not ready), if any.
        reason = not_ready_reason(record)
    if reason != row.status_reason:
        values["status_reason"] = reason
    if not values:
        return
    conn.execute(update(devices).where(devices.c.id == row.id).values(**values))
    changes.updated += 1
    if {"acc_status", "vanished", "status"} & values.keys():
        changes.dirty_rps.update(d.rp_uuid for d in node.deps_of.get(row.id, []) if d.rp_uuid)


def _sync_deployables(conn: Connection, hostname: str, device_id: int, record: HardwareRecord,
                      node: _Node, changes: Changes) -> None:
    wanted = set()
    for dep in record.deployables:
        name = deployable_name(hostname, dep.name)
        wanted.add(name)
        row = node.deployables.get(name)
        if row is None:
            if name not in node.added_deployables:
                continue  # held by another node: skipped by _add_deployables
            dep_id = node.added_deployables[name]
            existing_attrs: dict[str, Any] = {}
            existing_handles: dict[str, Any] = {}
        else:
            dep_id = row.id
            values: dict[str, Any] = {}
            if row.num_accelerators != dep.num_accelerators:
                values["num_accelerators"] = dep.num_accelerators
            if row.device_id != device_id:
                values["device_id"] = device_id
            if row.driver_name != record.driver_name:
                values["driver_name"] = record.driver_name
            if dep.bitstream_id and row.bitstream_id != dep.bitstream_id:
                values["bitstream_id"] = dep.bitstream_id
            if values:
                conn.execute(update(deployables).where(deployables.c.id == dep_id)
                             .values(**values))
                changes.updated += 1
                changes.dirty_rps.add(row.rp_uuid)
            existing_attrs = node.attrs_of.get(dep_id, {})
            existing_handles = node.handles_of.get(dep_id, {})
        if _sync_attributes(conn, dep_id, dep.attributes, existing_attrs, changes,
                            node.new_attributes):
            changes.dirty_rps.add(rp_uuid(name))
        _sync_handles(conn, device_id, dep_id, dep.attach_handles, existing_handles, changes,
                      node.new_handles)
    for row in node.deps_of.get(device_id, []):
        if row.name not in wanted:
            _remove_deployable(conn, row, node, changes)


def _traits_by_value(wanted: dict[str, str], existing: dict[str, Any]) -> dict[str, str]:
    """``wanted`` with each trait whose key no row has renamed to the key of a driver-owned
    trait row holding that value, if one is otherwise unclaimed."""
    spare = {row.value: key for key, row in existing.items()
             if key.startswith("trait") and key not in wanted and not row.operator_owned}
    if not spare:
        return wanted
    out: dict[str, str] = {}
    for key, value in wanted.items():
        if key.startswith("trait") and key not in existing and value in spare:
            key = spare.pop(value)
        out[key] = value
    return out


def _sync_attributes(conn: Connection, dep_id: int, wanted: dict[str, str],
                     existing: dict[str, Any], changes: Changes,
                     to_insert: list[dict[str, Any]]) -> bool:
    """Driver-owned attributes follow the report; operator-owned ones (created through the
    API) are never removed, and a key the driver reports takes the driver's value and
    becomes driver-owned: what the hardware says wins over what an operator typed.

    A trait is matched by its value, not its key's number: a row that already holds a
    reported trait under another ``trait*`` key (upstream Cyborg's fake driver writes
    ``traits1``, and an imported database keeps it) stays as it is, so the same hardware
    keeps the same rows."""
    wanted = _traits_by_value(wanted, existing)
    new = [{"uuid": str(uuidlib.uuid4()), "deployable_id": dep_id, "key": k, "value": v,
            "operator_owned": False} for k, v in wanted.items() if k not in existing]
    if new:
        to_insert.extend(new)  # written with the node's others (_insert_new_rows)
        changes.added += len(new)
    changed = 0
    for key, value in wanted.items():
        row = existing.get(key)
        if row is None:
            continue
        if row.operator_owned:
            if row.value != value:
                LOG.warning("Attribute %s=%r of deployable id %s, set by an operator, is now "
                            "reported by the driver as %r; the driver's value is kept",
                            key, row.value, dep_id, value)
            conn.execute(update(attributes).where(attributes.c.id == row.id).values(
                value=value, operator_owned=False))
            changed += 1
        elif row.value != value:
            conn.execute(update(attributes).where(attributes.c.id == row.id).values(value=value))
            changed += 1
    gone = [row.id for key, row in existing.items()
            if key not in wanted and not row.operator_owned]
    if gone:
        conn.execute(delete(attributes).where(attributes.c.id.in_(gone)))
    changes.updated += changed
    changes.removed += len(gone)
    return bool(new or changed or gone)


def _mdev_uuid(handle: Any) -> str:
    """A new handle's uuid. An MDEV handle's is its mdev's uuid (``attach_info["uuid"]``),
    so an ARQ's ``attach_handle_uuid`` names the mdev its consumer attaches (upstream
    Cyborg's contract); any other handle gets a fresh one."""
    mdev = handle.attach_info.get("uuid") if handle.attach_type == "MDEV" else None
    try:
        return str(uuidlib.UUID(mdev)) if isinstance(mdev, str) else str(uuidlib.uuid4())
    except ValueError:
        return str(uuidlib.uuid4())


def _fresh_uuids_where_taken(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """An mdev uuid already held by another handle row (a handle whose info changed, kept
    while in use) gets a fresh uuid rather than failing the whole reconcile."""
    if not any(row["attach_type"] == "MDEV" for row in rows):
        return
    wanted = [row["uuid"] for row in rows]
    taken = set(conn.execute(select(attach_handles.c.uuid).where(
        attach_handles.c.uuid.in_(wanted))).scalars())
    seen: set[str] = set()
    for row in rows:
        if row["uuid"] in taken or row["uuid"] in seen:
            row["uuid"] = str(uuidlib.uuid4())
        seen.add(row["uuid"])


def _sync_handles(conn: Connection, device_id: int, dep_id: int, wanted: list[Any],
                  existing: dict[str, Any], changes: Changes,
                  to_insert: list[dict[str, Any]]) -> None:
    reported = [(_handle_key(h.attach_type, h.attach_info), h) for h in wanted]
    keys = {key for key, _ in reported}
    # Rows naming a reported resource under other info (an mdev whose info changed shape, a
    # PCI function whose info gained a key): updated in place.
    adopted, existing = _adopt_same_handles(conn, device_id, dep_id, reported, existing,
                                            changes)
    new = []
    for key, handle in reported:
        if key not in existing and key not in adopted:
            new.append({"uuid": _mdev_uuid(handle), "deployable_id": dep_id,
                        "attach_type": handle.attach_type,
                        "attach_info": json_text(handle.attach_info), "in_use": False})
    if new:
        to_insert.extend(new)  # written with the node's others (_insert_new_rows)
        changes.added += len(new)
    kept = {row.id for row in adopted.values()}
    gone = []
    for key, row in existing.items():
        if key in keys or row.id in kept:
            continue
        if row.in_use:
            LOG.warning("Attach handle %s (%s) is no longer reported but is in use; kept "
                        "until released", row.uuid, row.attach_info)
            continue
        gone.append(row.id)
    if gone:
        # A bind may have taken one since the read: the condition is judged on the row as
        # committed now (or once that bind commits), so such a handle stays.
        changes.removed += conn.execute(delete(attach_handles).where(
            attach_handles.c.id.in_(gone), attach_handles.c.in_use == false())).rowcount


def _adopt_same_handles(conn: Connection, device_id: int, dep_id: int,
                        reported: list[tuple[str, Any]], existing: dict[str, Any],
                        changes: Changes) -> tuple[dict[str, Any], dict[str, Any]]:
    """Update in place each stored row that names a reported handle's resource under other
    attach info (acceld.db.handle_identity: an mdev by its uuid on its parent, a PCI or
    TEST_PCI handle by its function): it takes the reported info and keeps its id, uuid
    (an MDEV row takes its mdev's uuid) and ``in_use``, so an ARQ bound to it stays bound to
    the one row that names the resource. Returns the rows adopted by reported key, and the
    deployable's rows to diff the rest against.

    The device is locked first, as a removal does (``_lock_device``), then the deployable's
    rows are read again: a bind that took a row before commits first and is seen (which row
    is in use decides the pairing); a later bind waits and finds the updated row. A free row
    an earlier reconcile split off under the reported key is deleted; if a bind holds it
    too, both stay and an ERROR says so."""
    if not handle_identity.renamed(reported, existing):
        return {}, existing
    _lock_device(conn, device_id)
    existing = {_handle_key(row.attach_type, orjson.loads(row.attach_info)): row
                for row in conn.execute(select(attach_handles).where(
                    attach_handles.c.deployable_id == dep_id).order_by(attach_handles.c.id))}
    pairings = handle_identity.pair_by_identity(reported, existing)
    adopted: dict[str, Any] = {}
    for pair in pairings:
        if pair.duplicate is not None:
            freed = conn.execute(delete(attach_handles).where(
                attach_handles.c.id == pair.duplicate.id,
                attach_handles.c.in_use == false())).rowcount
            if not freed:
                LOG.error("Attach handles %s and %s name the same %s %s and are both in "
                          "use; left as they are", pair.row.uuid, pair.duplicate.uuid,
                          pair.handle.attach_type, handle_identity.handle_identity(
                              pair.handle.attach_type, pair.handle.attach_info)[1])
                continue
            changes.removed += 1
        adopted[pair.key] = pair.row
    taking = [p for p in pairings if p.key in adopted]
    wanted = {p.row.id: _mdev_uuid(p.handle) for p in taking if p.handle.attach_type == "MDEV"}
    taken = set(conn.execute(select(attach_handles.c.uuid).where(
        attach_handles.c.uuid.in_(sorted(set(wanted.values()))),
        attach_handles.c.id.notin_(sorted(wanted)))).scalars()) if wanted else set()
    for pair in taking:
        values: dict[str, Any] = {"attach_info": json_text(pair.handle.attach_info)}
        if pair.row.id in wanted and wanted[pair.row.id] not in taken:
            values["uuid"] = wanted[pair.row.id]
        conn.execute(update(attach_handles).where(attach_handles.c.id == pair.row.id)
                     .values(**values))
        LOG.info("Attach handle %s takes %s: the same %s, reported with other attach info; "
                 "its id and binding are kept", pair.row.uuid, values, pair.handle.attach_type)
        if pair.row.in_use and needs_attach_step(
                pair.row.attach_type, orjson.loads(pair.row.attach_info)) != needs_attach_step(
                pair.handle.attach_type, pair.handle.attach_info):
            LOG.warning("Attach handle %s is in use and its new attach info changes whether "
                        "it needs a host step; its release follows the new info", pair.row.uuid)
        changes.updated += 1
    return adopted, existing


def _in_use(node: _Node, dep_ids: Iterable[int]) -> bool:
    return any(h.in_use for d in dep_ids for h in node.handles_of.get(d, {}).values())


def _in_use_now(conn: Connection, device_id: int, dep_ids: list[int]) -> bool:
    """Lock the device row, then its deployables' handles, and say whether one is in use as
    committed now. The diff's read may be older than a bind that took a handle since; from
    here on no bind can take one (it needs the device row) until this transaction ends."""
    _lock_device(conn, device_id)
    if not dep_ids:
        return False
    return any(conn.execute(select(attach_handles.c.in_use).where(
        attach_handles.c.deployable_id.in_(dep_ids)).order_by(attach_handles.c.id)
        .with_for_update()).scalars())


def _lock_device(conn: Connection, device_id: int) -> None:
    """Lock the device row exclusively through its ``uuid`` index, the way a bind reaches it.

    MariaDB locks index entries: a bind's shared lock goes through the ``uuid`` index entry
    and then the row (acceld.conductor.binding.target.lock_device). Locked through the primary
    key only, a removal would meet a bind that holds the ``uuid`` entry and waits for the
    row when its DELETE needs that entry: a deadlock (1213). Locking the entry first makes
    the later of the two wait for the earlier, as on PostgreSQL (acceld.db.host_retire
    does the same)."""
    uuid = conn.execute(select(devices.c.uuid).where(devices.c.id == device_id)).scalar()
    if uuid is not None:
        conn.execute(select(devices.c.id).where(devices.c.uuid == uuid).with_for_update())
    conn.execute(select(devices.c.id).where(devices.c.id == device_id).with_for_update())


def _remove_deployable(conn: Connection, row: Any, node: _Node, changes: Changes) -> None:
    held = _in_use(node, [row.id])
    if held:
        # The read alone decided: lock the device (_in_use_now locks it otherwise).
        _lock_device(conn, row.device_id)
    if held or _in_use_now(conn, row.device_id, [row.id]):
        # Kept for its users, but its free handles are gone from the node: no new bind may
        # take one. The device lock makes a bind that has not taken its handle yet wait,
        # then find none.
        freed = conn.execute(delete(attach_handles).where(
            attach_handles.c.deployable_id == row.id,
            attach_handles.c.in_use == false())).rowcount
        changes.removed += freed
        if freed:
            LOG.warning("Deployable %s is no longer reported but one of its attach handles is "
                        "in use; kept until released, its %d free handles removed", row.name,
                        freed)
        return
    conn.execute(delete(attributes).where(attributes.c.deployable_id == row.id))
    conn.execute(delete(attach_handles).where(attach_handles.c.deployable_id == row.id))
    conn.execute(delete(deployables).where(deployables.c.id == row.id))
    changes.removed += 1
    if row.rp_uuid:
        changes.dirty_rps.add(row.rp_uuid)


def _remove_device(conn: Connection, row: Any, node: _Node, changes: Changes) -> None:
    deps = node.deps_of.get(row.id, [])
    dep_ids = [d.id for d in deps]
    if _in_use(node, dep_ids) or _in_use_now(conn, row.id, dep_ids):
        changes.held.append(row.uuid)
        if not row.vanished:
            changes.dirty_rps.update(d.rp_uuid for d in deps if d.rp_uuid)
            conn.execute(update(devices).where(devices.c.id == row.id).values(
                status="maintaining", vanished=True, status_reason=VANISHED_REASON))
            changes.updated += 1
            events.record(conn, row.uuid, row.hostname, events.VANISHED,
                          f"No longer reported by host {row.hostname} while in use; held "
                          "until released")
            LOG.warning("Device %s on %s vanished while in use; kept as maintaining until "
                        "released", row.uuid, row.hostname)
        return
    changes.dirty_rps.update(d.rp_uuid for d in deps if d.rp_uuid)
    if dep_ids:
        conn.execute(delete(attributes).where(attributes.c.deployable_id.in_(dep_ids)))
        conn.execute(delete(attach_handles).where(attach_handles.c.deployable_id.in_(dep_ids)))
        conn.execute(delete(deployables).where(deployables.c.id.in_(dep_ids)))
    conn.execute(delete(controlpath_ids).where(controlpath_ids.c.device_id == row.id))
    conn.execute(delete(devices).where(devices.c.id == row.id))
    changes.removed += 1
    events.record(conn, row.uuid, row.hostname, events.VANISHED,
                  f"No longer reported by host {row.hostname}" + (
                      "; released and removed from the inventory" if row.vanished else
                      "; removed from the inventory"))
