"""A host to retire, for the host-delete tests: one node with a fake FPGA (two attach
handles) and its agent row, the API, a bind worker and (optionally) a recording Nova."""

from __future__ import annotations

import datetime as dt
import uuid as uuidlib
from typing import Any

from falcon import testing
from sqlalchemy import func, insert, select

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import inventory
from acceld.db.models import (accelerator_requests, agents, attach_handles, bind_jobs,
                              deployables, devices, handle_releases, placement_sync, utcnow)
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE, version
from tests.support.nova import RecordingNova
from tests.support.told import agent_told

ARQS = "/accelerator/v2/accelerator_requests"
HOSTS = "/accelerator/v2/hosts"
V25 = version("2.5")


def rp_of(host: str) -> str:
    """The provider uuid of the fake driver's deployable on ``host``."""
    return str(uuidlib.uuid3(uuidlib.NAMESPACE_DNS, f"{host}_FakeDevice"))


class HostRig:
    """``host`` (agent ``agent_state``) with one fake FPGA; ARQs bound through the API."""

    def __init__(self, db, tmp_path, nova: RecordingNova | None = None,  # type: ignore[no-untyped-def]
                 host: str = "node-1", agent_state: str = "down", **overrides: Any) -> None:
        self.db = db
        self.nova = nova
        self.host = host
        extra = {} if nova is None else {"nova__auth_type": "none",
                                         "nova__endpoint_override": nova.url,
                                         "nova__connect_retries": 0,
                                         "nova__status_code_retries": 0}
        self.conf = make_conf(str(tmp_path), fake_driver__attach_handles=2, **extra,
                              **overrides)
        self.client = testing.TestClient(build_app(self.conf, db))
        self.add_host(host, agent_state)
        assert self.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": "dp", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201

    def add_host(self, host: str, agent_state: str | None) -> None:
        """The host's inventory as reconciliation stores it, and its agent row."""
        with self.db.write() as conn:
            if agent_state is not None:
                conn.execute(insert(agents).values(
                    hostname=host, endpoint=f"{host}:6668", state=agent_state,
                    heartbeat_interval=10, hardware_digest="d1",
                    last_seen_at=utcnow() - dt.timedelta(minutes=5)))
            inventory.reconcile_node(conn, host, FakeDriver(self.conf, host).discover())
            agent_told(conn)  # no agent server: PCI binds in one transaction

    def set_agent(self, state: str) -> None:
        from sqlalchemy import update

        with self.db.write() as conn:
            conn.execute(update(agents).where(agents.c.hostname == self.host).values(state=state))

    def start_bind(self, instance: str | None = None, host: str | None = None) -> tuple[str, str]:
        """An ARQ in BindStarted with its job pending: (arq uuid, instance uuid)."""
        host = host or self.host
        instance = instance or str(uuidlib.uuid4())
        [arq] = self.client.simulate_post(ARQS, json={"device_profile_name": "dp"},
                                          headers=ADMIN).json["arqs"]
        ops = [{"op": "add", "path": "/hostname", "value": host},
               {"op": "add", "path": "/device_rp_uuid", "value": rp_of(host)},
               {"op": "add", "path": "/instance_uuid", "value": instance}]
        result = self.client.simulate_patch(ARQS, json={arq["uuid"]: ops}, headers=SERVICE)
        assert result.status_code == 202, result.text
        return arq["uuid"], instance

    def run_binds(self) -> int:
        worker = BindWorker(self.conf, self.db)
        done = 0
        while count := worker.run_once():
            done += count
        return done

    def bind(self, host: str | None = None, instance: str | None = None) -> tuple[str, str]:
        """A Bound ARQ (its agent must be up to bind): (arq uuid, instance uuid)."""
        made = self.start_bind(instance=instance, host=host)
        self.run_binds()
        assert self.arq(made[0])["state"] == "Bound", self.arq(made[0])
        return made

    def delete(self, host: str | None = None, force: bool | None = None,
               headers: dict | None = None):  # type: ignore[no-untyped-def]
        query = None if force is None else f"force={str(force).lower()}"
        return self.client.simulate_delete(f"{HOSTS}/{host or self.host}", query_string=query,
                                           headers=headers or {**ADMIN, **V25})

    def arq(self, uuid: str) -> dict:
        return self.client.simulate_get(f"{ARQS}/{uuid}", headers={**ADMIN, **version("2.4")}
                                        ).json

    def nova_heard(self, uuid: str) -> list[str]:
        assert self.nova is not None
        return [e["status"] for e in self.nova.events() if e["tag"] == uuid]

    def counts(self, host: str | None = None) -> dict[str, int]:
        """What the database holds for ``host``: agent, devices, deployables, handles,
        queued releases, provider rows (and how many of those are flagged)."""
        host = host or self.host
        on_host = select(devices.c.id).where(devices.c.hostname == host)
        deps = select(deployables.c.id).where(deployables.c.device_id.in_(on_host))
        with self.db.read() as conn:
            def count(table, *where) -> int:  # type: ignore[no-untyped-def]
                return conn.execute(select(func.count()).select_from(table).where(*where)
                                    ).scalar_one()

            return {
                "agent": count(agents, agents.c.hostname == host),
                "devices": count(devices, devices.c.hostname == host),
                "deployables": count(deployables, deployables.c.device_id.in_(on_host)),
                "handles": count(attach_handles, attach_handles.c.deployable_id.in_(deps)),
                "releases": count(handle_releases, handle_releases.c.hostname == host),
                "providers": count(placement_sync, placement_sync.c.hostname == host),
                "flagged": count(placement_sync, placement_sync.c.hostname == host,
                                 placement_sync.c.dirty.is_(True)),
            }

    def handles_without_owner(self) -> int:
        """Bound ARQs whose handle is gone: what a retire must never leave."""
        with self.db.read() as conn:
            return conn.execute(select(func.count()).select_from(accelerator_requests).where(
                accelerator_requests.c.state == "Bound",
                accelerator_requests.c.attach_handle_id.is_(None))).scalar_one()

    def jobs(self, arq_uuid: str) -> list[str]:
        with self.db.read() as conn:
            return list(conn.scalars(select(bind_jobs.c.phase).join(
                accelerator_requests, accelerator_requests.c.id == bind_jobs.c.arq_id).where(
                accelerator_requests.c.uuid == arq_uuid)))
