"""The last API program's status on a deployable: who may overwrite it, and the sweep
that fails programs a stopped conductor left PROGRAMMING (every backend)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select, update

from acceld.conductor.programming import ProgrammingComponent
from acceld.db import deployables as dep_db
from acceld.db.models import deployables, utcnow
from tests.conftest import make_conf
from tests.support import inventory


def _status(db, dep_id: int) -> tuple:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return tuple(conn.execute(select(deployables.c.program_status,
                                         deployables.c.program_reason)
                                  .where(deployables.c.id == dep_id)).one())


def test_a_later_request_is_not_overwritten_by_an_earlier_one(db):
    dep = inventory.add_fpga(db)["deployable"]
    with db.write() as conn:
        assert dep_db.start_program(conn, dep["id"], "first")
        assert dep_db.start_program(conn, dep["id"], "second")
        assert not dep_db.finish_program(conn, dep["id"], "first", dep_db.FAILED, "late")
    assert _status(db, dep["id"]) == ("PROGRAMMING", None)
    with db.write() as conn:
        assert dep_db.finish_program(conn, dep["id"], "second", dep_db.SUCCEEDED, None)
    assert _status(db, dep["id"]) == ("SUCCEEDED", None)


def test_the_sweep_fails_only_programs_older_than_any_live_one(db, tmp_path):
    conf = make_conf(str(tmp_path), conductor__program_timeout=10)
    stale = inventory.add_fpga(db, hostname="stale-host")["deployable"]
    fresh = inventory.add_fpga(db, hostname="fresh-host")["deployable"]
    with db.write() as conn:
        for dep in (stale, fresh):
            dep_db.start_program(conn, dep["id"], f"request-{dep['id']}")
        # 2 x program_timeout + 60 s is the longest a live program can take.
        conn.execute(update(deployables).where(deployables.c.id == stale["id"]).values(
            program_started_at=utcnow() - dt.timedelta(seconds=81)))
        conn.execute(update(deployables).where(deployables.c.id == fresh["id"]).values(
            program_started_at=utcnow() - dt.timedelta(seconds=75)))
    ProgrammingComponent(conf, db).fail_stale()
    status, reason = _status(db, stale["id"])
    assert status == "FAILED" and "stopped before it finished" in reason
    assert _status(db, fresh["id"]) == ("PROGRAMMING", None)
