"""Programming's moving parts in process: an agent and a conductor on internal servers.

:class:`Chain` starts the agent's programming routes (with real drivers) and
the conductor's programming component on loopback internal servers, registers
the agent for host ``node1``, adds the fake FPGA to the inventory, and gives a
Falcon test client of the API whose conductor client reaches that conductor.
The configuration carries the shared secret, so other conductor pieces built
from it (the bind worker) reach the same agent.
"""

from __future__ import annotations

import uuid

from falcon import testing
from sqlalchemy import insert, select

from acceld.agent.programming import Programming
from acceld.api.app import build_app
from acceld.clients.conductor import ConductorClient
from acceld.conductor.programming import Programmer, ProgrammingComponent
from acceld.db.models import agents, deployables
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app as internal_app
from tests.helpers import ADMIN
from tests.support import inventory

SECRET = b"test-secret-for-programming-0123456789"
HOST = "node1"
IMAGE = str(uuid.uuid4())
FIRMWARE = str(uuid.uuid4())
DATA = b"\x55\xaa fpga bitstream" * 64


class Chain:
    """Agent and conductor internal servers, and an API client wired to them."""

    def __init__(self, conf, db, source=None, drivers=None, handles: int = 1) -> None:
        conf.set_override("shared_secret", SECRET.decode(), group="internal")
        self.conf, self.db = conf, db
        self.fake = FakeDriver(conf, HOST)
        self.drivers = drivers if drivers is not None else {"fake": self.fake}
        self.agent_routes = Programming(conf, self.drivers.get, source)
        self.agent = InternalServer(internal_app(SECRET, 60, self.agent_routes.routes(),
                                                 destination=auth.agent_destination(HOST)),
                                    "127.0.0.1", 0).start()
        self.component = ProgrammingComponent(conf, db)
        self.component.programmer = Programmer(conf, db, SECRET)
        self.conductor = InternalServer(internal_app(SECRET, 60, self.component.routes(),
                                                     destination=auth.CONDUCTOR),
                                        "127.0.0.1", 0).start()
        self.client = testing.TestClient(build_app(
            conf, db, ConductorClient(self.conductor.url, SECRET)))
        with db.write() as conn:
            conn.execute(insert(agents).values(hostname=HOST, endpoint=self.agent.url[7:],
                                               state="up", heartbeat_interval=10))
        self.fpga = inventory.add_fpga(db, hostname=HOST, driver_name="fake", handles=handles)
        self.dep = self.fpga["deployable"]

    def stop(self) -> None:
        self.agent.stop()
        self.conductor.stop()

    def bitstream(self) -> str | None:
        with self.db.read() as conn:
            return conn.execute(select(deployables.c.bitstream_id).where(
                deployables.c.id == self.dep["id"])).scalar_one()

    def patch(self, url: str, body):  # type: ignore[no-untyped-def]
        return self.client.simulate_patch(f"/accelerator/v2/deployables/{url}", headers=ADMIN,
                                          json=body)
