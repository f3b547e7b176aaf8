"""The bound-ARQs part of ``acceld-status upgrade check``: every Bound accelerator request
still holds its attach handle and deployable, that handle is marked in use, and every
device still has its control path.

An upgrade through migration 0005 on SQLite by an acceld before the fix of issue 24 rebuilt
``devices`` with foreign keys on: the cascade deleted the inventory's rows (deployables,
attach handles, ...) and set the Bound ARQs' ``attach_handle_id`` and ``deployable_id`` to
NULL; the device rows stayed, without their control paths. The instances keep their
devices, but acceld no longer knows it: binds to those providers fail, and once the node's
hardware is pulled again (its hardware digest changed) its handles come back free, and
another bind can take a device a running instance uses. This names those ARQs, and the
devices left without their rows, so that the operator can repair them (docs/arqs.md,
"Bound ARQs without an attach handle").
"""

from __future__ import annotations

from typing import Any, Sequence

from oslo_config import cfg
from oslo_upgradecheck.upgradecheck import Code, Result
from sqlalchemy import Connection, or_, select

SHOWN = 50  # ARQs listed in the result; the rest are counted


def damaged_bound_arqs(conn: Connection) -> Sequence[Any]:
    """Bound ARQs without an attach handle or deployable, or whose handle is free:
    (uuid, instance_uuid, hostname, device_rp_uuid, problem), oldest first. Only columns
    of the first revision, so it runs on a database not yet upgraded too."""
    from acceld.db.accelerator_requests import BOUND
    from acceld.db.models import accelerator_requests as arqs
    from acceld.db.models import attach_handles as handles

    rows = conn.execute(
        select(arqs.c.uuid, arqs.c.instance_uuid, arqs.c.hostname, arqs.c.device_rp_uuid,
               arqs.c.attach_handle_id, arqs.c.deployable_id, handles.c.in_use)
        .select_from(arqs.outerjoin(handles, handles.c.id == arqs.c.attach_handle_id))
        .where(arqs.c.state == BOUND, or_(arqs.c.attach_handle_id.is_(None),
                                          arqs.c.deployable_id.is_(None),
                                          handles.c.in_use.is_not(True)))
        .order_by(arqs.c.id)).all()
    return [(r.uuid, r.instance_uuid, r.hostname, r.device_rp_uuid,
             "no attach handle" if r.attach_handle_id is None
             else "no deployable" if r.deployable_id is None
             else "its attach handle is marked free") for r in rows]


def hollow_devices(conn: Connection) -> Sequence[Any]:
    """Devices without a control path, (uuid, hostname) by host: the rows the cascade left
    (it deleted their control paths and deployables, not the devices). Reconciliation
    matches a reported device by its control path, so it neither updates nor removes
    these: a report adds the hardware again as a second device with a fresh uuid."""
    from acceld.db.models import controlpath_ids, devices

    return conn.execute(
        select(devices.c.uuid, devices.c.hostname)
        .where(~select(controlpath_ids.c.id)
               .where(controlpath_ids.c.device_id == devices.c.id).exists())
        .order_by(devices.c.hostname, devices.c.id)).all()


def describe_devices(rows: Sequence[Any]) -> str:
    hosts = sorted({r.hostname for r in rows})
    listed = ", ".join(f"{uuid} ({host})" for uuid, host in rows[:SHOWN])
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return (f"{len(rows)} device(s) on {len(hosts)} host(s) ({', '.join(hosts)}) have lost "
            f"their control paths, deployables and attach handles: {listed}{more}; binds "
            "to them fail until the inventory is repaired (docs/arqs.md, \"Bound ARQs "
            "without an attach handle\").")


def describe(rows: Sequence[Any]) -> str:
    listed = "; ".join(f"ARQ {uuid} (instance {instance}, host {host}, provider {rp}): "
                       f"{problem}" for uuid, instance, host, rp, problem in rows[:SHOWN])
    more = f"; and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    instances = len({r[1] for r in rows})
    return (f"{len(rows)} Bound accelerator request(s) of {instances} instance(s) do not "
            f"hold their device in acceld's records: {listed}{more}. Those instances keep "
            "their devices, but acceld can give the same device to another bind once the "
            "host reports again (a database damaged by an upgrade through migration 0005 "
            "on SQLite before issue 24's fix). Repair each instance as docs/arqs.md, "
            "\"Bound ARQs without an attach handle\", says.")


def check_arqs(conf: cfg.ConfigOpts) -> Result:
    from sqlalchemy.exc import DBAPIError

    from acceld.db import migrate
    from acceld.db.engine import from_config

    db = from_config(conf)
    try:
        if migrate.current_revision(db) is None:
            return Result(Code.SUCCESS, "No schema yet: no accelerator request to check.")
        with db.read() as conn:
            rows = damaged_bound_arqs(conn)
            hollow = hollow_devices(conn)
    except DBAPIError as exc:
        return Result(Code.FAILURE, f"The database cannot be reached: {exc.orig or exc}")
    finally:
        db.dispose()
    found = ([describe(rows)] if rows else []) + ([describe_devices(hollow)] if hollow else [])
    if found:
        return Result(Code.FAILURE, " ".join(found))
    return Result(Code.SUCCESS, "Every Bound accelerator request holds its attach handle "
                                "and every device its control path.")
