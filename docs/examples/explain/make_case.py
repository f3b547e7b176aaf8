"""The real case of docs/explain.md: five hosts, each kept from an FPGA profile in its own way,
against a real Placement; then `acceld explain` is run on it and its output printed.

Run from the repository root: ``PYTHONPATH=. .venv/bin/python docs/examples/explain/make_case.py``.
It starts the test suite's Placement (tests.support.placement, noauth2 on loopback) in a
temporary directory, writes acceld's inventory as the fake driver reports it, lets the
conductor's sync write Placement, changes things the way operators and hardware do, and
stops Placement again. Nothing outside the temporary directory is touched.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
import uuid as uuidlib
from pathlib import Path

from sqlalchemy import insert, select, update

from acceld import config
from acceld.conductor.placement.sync import PlacementSync
from acceld.db import agents as agents_db
from acceld.db import inventory, migrate
from acceld.db.engine import Database
from acceld.db.models import (accelerator_requests, agents, attach_handles, deployables,
                              device_profiles, devices, utcnow)
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf
from tests.support.placement import PlacementServer

HOSTS = ["cn-1", "cn-2", "cn-3", "cn-4", "cn-5"]
INSTANCE = "0b9a7c36-5c1d-4f0e-8f7b-3e2d1c4b5a69"
GROUPS = '[{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]'


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="acceld-explain-case-"))
    placement = PlacementServer(work / "placement").start()
    try:
        state = work / "state"
        conf = make_conf(str(state), fake_driver__attach_handles=1)
        placement.configure(conf)
        db = Database(config.database_url(conf))
        migrate.upgrade(db)
        with db.write() as conn:
            conn.execute(insert(device_profiles).values(
                uuid=str(uuidlib.uuid4()), name="fpga-dp", profile_json=GROUPS,
                created_at=utcnow()))
            for host in HOSTS:
                placement.create_compute_node(host)
                inventory.reconcile_node(conn, host, FakeDriver(conf, host).discover())
                agents_db.record_heartbeat(conn, host, f"{host}:6668", 10)
        with db.write() as conn:
            # cn-2: disabled by an operator, with a reason (as PATCH /v2/devices/{uuid} does).
            conn.execute(update(devices).where(devices.c.hostname == "cn-2").values(
                status="maintaining", status_reason="fan swap, ticket OPS-1432"))
            # cn-3: its agent fell silent (the liveness sweep marked it down).
            conn.execute(update(agents).where(agents.c.hostname == "cn-3").values(
                state="down", last_seen_at=utcnow() - dt.timedelta(minutes=42)))
            # cn-4: its only handle is bound to an instance.
            profile_id = conn.scalar(select(device_profiles.c.id))
            handle = conn.execute(select(attach_handles.c.id, deployables.c.rp_uuid).join(
                deployables, deployables.c.id == attach_handles.c.deployable_id).join(
                devices, devices.c.id == deployables.c.device_id).where(
                devices.c.hostname == "cn-4")).first()
            conn.execute(update(attach_handles).where(attach_handles.c.id == handle.id)
                         .values(in_use=True))
            conn.execute(insert(accelerator_requests).values(
                uuid="7d6c1f0e-4a53-4d0b-9a8e-2b8f1b1c9e01", state="Bound",
                device_profile_id=profile_id, device_profile_group_id=0, project_id="demo",
                hostname="cn-4", device_rp_uuid=handle.rp_uuid,
                instance_uuid=INSTANCE,
                attach_handle_id=handle.id, created_at=utcnow()))
            # cn-5: the driver reported it unhealthy; the conductor quarantined it.
            conn.execute(update(devices).where(devices.c.hostname == "cn-5").values(
                health="unhealthy", health_reason="uncorrectable ECC errors: 3",
                quarantined=True, quarantined_at=utcnow() - dt.timedelta(hours=2)))
        PlacementSync(conf, db).sync_once()
        # ... and Nova allocated it to that instance when it scheduled it.
        placement.put(f"/allocations/{INSTANCE}", {
            "allocations": {handle.rp_uuid: {"resources": {"FPGA": 1}}}, "project_id": "demo",
            "user_id": "demo", "consumer_generation": None, "consumer_type": "INSTANCE"})
        with db.read() as conn:
            rp = conn.scalar(select(deployables.c.rp_uuid).join(
                devices, devices.c.id == deployables.c.device_id).where(
                devices.c.hostname == "cn-1"))
        # cn-1: someone reserved its inventory in Placement by hand.
        inv = placement.get(f"/resource_providers/{rp}/inventories").json()
        placement.put(f"/resource_providers/{rp}/inventories", {
            "resource_provider_generation": inv["resource_provider_generation"],
            "inventories": {"FPGA": {"total": 1, "reserved": 1, "max_unit": 1}}})
        db.dispose()
        conf_file = work / "acceld.conf"
        conf_file.write_text(placement.config_lines())
        for args in (["fpga-dp"], ["fpga-dp", "--host", "cn-4", "--json"]):
            print(f"$ acceld explain {' '.join(args)}")
            done = subprocess.run([sys.executable, "-m", "acceld.cmd.main", "explain", *args,
                                   "--config-file", str(conf_file), "--state-path", str(state)],
                                  capture_output=True, text=True, timeout=60)
            print(done.stdout + done.stderr + f"(exit status {done.returncode})\n")
    finally:
        placement.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
