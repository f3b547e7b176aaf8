"""Upstream Cyborg 17's conductor taking its fake driver's report, and binding two ARQs: run by
upstream's interpreter (.upstream/venv), never imported by acceld's tests.

    .upstream/venv/bin/python tests/support/upstream_report.py DB_URL HOST PLACEMENT_URL

``ConductorManager.report_data`` is what the conductor runs for each agent report (the RPC
call's body): it writes the device, deployable, attributes and attach handles into
upstream's database and creates the deployable's Placement provider (uuid, name, parent,
resource class, inventory, traits) exactly as a running upstream does. The binds are
upstream's database calls of a bind (an attach handle allocated, the ARQ Bound). Prints
JSON: the deployable's provider uuid and the instances bound.
"""

import json
import sys
import tempfile
import uuid


def main(url: str, host: str, placement_url: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as conf:
        conf.write(f"[DEFAULT]\nhost = {host}\n[database]\nconnection = {url}\n"
                   f"[placement]\nauth_type = admin_token\nendpoint = {placement_url}\n"
                   "token = admin\n")
    from cyborg import context, objects
    from cyborg.accelerator.drivers.fake import FakeDriver
    from cyborg.conductor.manager import ConductorManager
    from cyborg.conf import CONF
    from cyborg.db import api as dbapi

    CONF(["--config-file", conf.name], project="cyborg")
    objects.register_all()
    ctx = context.get_admin_context()
    ConductorManager("cyborg-conductor", host).report_data(ctx, host, FakeDriver().discover())

    api = dbapi.get_instance()
    name = f"{host}_FakeDevice"
    deployable = [d for d in api.deployable_list(ctx) if d.name == name][0]
    profile = api.device_profile_create(ctx, {
        "name": f"fpga-{host}", "profile_json": json.dumps(
            {"groups": [{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]})})
    instances = [str(uuid.uuid4()), str(uuid.uuid4())]
    for instance in instances:
        arq = api.extarq_create(ctx, {"device_profile_id": profile.id,
                                      "device_profile_group_id": 0, "state": "Initial",
                                      "project_id": "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5"})
        handle = api.attach_handle_allocate(ctx, deployable.id)
        api.extarq_update(ctx, arq.uuid, {
            "state": "Bound", "hostname": host, "device_rp_uuid": deployable.rp_uuid,
            "instance_uuid": instance, "attach_handle_id": handle.id,
            "deployable_id": deployable.id})
    api.extarq_create(ctx, {"device_profile_id": profile.id, "device_profile_group_id": 0,
                            "state": "Initial", "project_id": "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5"})
    print(json.dumps({"rp_uuid": deployable.rp_uuid, "instances": instances}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
