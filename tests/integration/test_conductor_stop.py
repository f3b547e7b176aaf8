"""A conductor stopped with SIGTERM gives its exclusive leases back and leaves the ring
(its row of ``conductors`` deleted) before it exits, so another conductor takes its
periodic tasks and its hosts over at once instead of after the lease (three intervals,
at least ten seconds) or the liveness bound. A real `acceld conductor` process, SQLite."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import select

from acceld.db.engine import Database
from acceld.db.models import conductors, leases
from acceld.runtime.secrets import ensure_secret_file
from tests.integration.test_agents import Process, wait_for, write_conf
from tests.support.net import free_port

pytestmark = pytest.mark.integration


def test_sigterm_gives_the_leases_back(tmp_path):
    state = tmp_path / "state"
    ensure_secret_file(str(state))
    port = free_port()
    conf = write_conf(tmp_path / "conductor.conf", {
        "DEFAULT": {"state_path": state},
        "conductor": {"port": port, "agent_check_interval": 0.2, "name": "stopping"},
    })
    subprocess.run([sys.executable, "-m", "acceld.cmd.main", "db", "upgrade", "--config-file", conf],
                   check=True, capture_output=True, timeout=60)
    db = Database(f"sqlite:///{state}/acceld.sqlite")

    def held() -> dict[str, str]:
        with db.read() as conn:
            return dict(conn.execute(select(leases.c.name, leases.c.owner)).all())

    def members() -> list[str]:
        with db.read() as conn:
            return list(conn.scalars(select(conductors.c.name)))

    conductor = Process("conductor", ["conductor", "--config-file", conf], tmp_path, port)
    try:
        conductor.start()
        wait_for(lambda: "program-sweep" in held(), 30, "the program sweep's lease")
        assert members() == ["stopping"]
        conductor.stop()  # SIGTERM, waits for the exit
        assert conductor.proc.returncode == 0, conductor.log()
        assert "program-sweep" not in held(), conductor.log()
        assert members() == [], conductor.log()
        assert "Conductor stopping left the ring" in conductor.log(), conductor.log()
    finally:
        conductor.stop()
        db.dispose()
