"""Orphaned host steps, as real processes: an agent reports, the conductor releases.

A conductor and one agent (the fake driver's simulated mdevs) on loopback, SQLite. An mdev
is left on the node for a free handle (what a lost prepare leaves); within a few discovery
intervals the agent's signed report reaches the conductor, which queues the release, and
the conductor's release worker has the agent remove it. An mdev whose handle is in use,
reported in the same pass, stays. Every wait is bounded. The database's decision is tested
on every backend in tests/unit/test_host_step_orphans.py.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, update

from acceld.db import handle_releases
from acceld.db.engine import Database
from acceld.db.models import attach_handles
from acceld.drivers.base import AttachHandle
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf
from tests.integration.test_agents import Cluster, wait_for, write_conf
from tests.support.databases import private_database

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    with private_database("sqlite", tmp_path) as url:
        built = Cluster(tmp_path, url)
        built.common["conductor"]["bind_poll_interval"] = 1  # the release worker's pace
        built.base_conf = write_conf(tmp_path / "base.conf", built.common)
        yield built, url
        built.stop()


def test_orphaned_mdev_is_released_and_a_used_one_kept(cluster):
    cluster, url = cluster
    spec = cluster.spec("node-a", [{"type": "FPGA", "attach_type": "MDEV",
                                    "attach_handles": 2}])
    cluster.conductor()
    cluster.agent("node-a", fake_driver={"spec_file": spec})
    db = Database(url)

    def handles() -> list:
        with db.read() as conn:
            return conn.execute(select(attach_handles.c.id, attach_handles.c.attach_info,
                                       attach_handles.c.in_use)
                                .order_by(attach_handles.c.id)).all()

    wait_for(lambda: len(handles()) == 2, 20, "the node's two handles")
    used, orphan = handles()
    with db.write() as conn:  # as if a Bound ARQ held it
        conn.execute(update(attach_handles).where(attach_handles.c.id == used.id)
                     .values(in_use=True))
    # The same simulated node as the agent's driver (one state directory).
    fake = FakeDriver(make_conf(str(cluster.state), fake_driver__spec_file=spec), "node-a")
    for row in (used, orphan):
        fake.prepare_attach_handle(AttachHandle("MDEV", json.loads(row.attach_info)))
    uuid_used = json.loads(used.attach_info)["uuid"]
    wait_for(lambda: set(fake.attach_state()["prepared"]) == {uuid_used}, 30,
             f"the orphan's release (agent log: {cluster.processes['node-a'].log()[-600:]})")
    wait_for(lambda: [h.in_use for h in handles()] == [True, False], 10, "the handle freed")
    with db.read() as conn:
        assert list(handle_releases.pending(conn)) == []
    assert ["release", json.loads(orphan.attach_info)["uuid"]] in fake.attach_state()["log"]
    log = cluster.processes["conductor"].log()
    assert "orphaned attach handle" in log
    db.dispose()
