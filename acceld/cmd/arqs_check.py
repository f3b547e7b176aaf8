"""The bound-ARQs part of ``acceld-status upgrade check``: every Bound accelerator request
still holds its attach handle and deployable, and that handle is marked in use.

An upgrade through migration 0005 on SQLite by an acceld before the fix of issue 24 rebuilt
``devices`` with foreign keys on: the cascade deleted the inventory's rows (deployables,
attach handles, ...) and set the Bound ARQs' ``attach_handle_id`` and ``deployable_id`` to
NULL. The instances keep their devices, but acceld no longer knows it: once the host's
agent reports again its handles come back free, and another bind can take a device a
running instance uses. This names those ARQs so the operator can repair them
(docs/arqs.md, "Bound ARQs without an attach handle").
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
    except DBAPIError as exc:
        return Result(Code.FAILURE, f"The database cannot be reached: {exc.orig or exc}")
    finally:
        db.dispose()
    if rows:
        return Result(Code.FAILURE, describe(rows))
    return Result(Code.SUCCESS, "Every Bound accelerator request holds its attach handle.")
