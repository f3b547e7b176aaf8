"""Fill an upstream Cyborg 17 database with the rows a running cloud has, through upstream's
own database API (cyborg.db.api): run by upstream's interpreter (.upstream/venv), never
imported by acceld's tests.

    .upstream/venv/bin/python tests/support/upstream_fill.py URL

The rows are what upstream's conductor writes for its agents' reports and Nova's binds:
compute-01 runs the fake driver (one FPGA, 16 TEST_PCI handles), compute-02 an NVIDIA T4
whole (PGPU, one PCI handle), a T4 split into vGPUs (VGPU, four MDEV handles) and an
Inspur NVMe drive being cleaned; three device profiles; ARQs in every state upstream has,
two instances bound; an operator's attribute; a quota usage row.
"""

import json
import sys
import uuid

from oslo_config import cfg


def main(url: str) -> None:
    from cyborg import context
    from cyborg.conf import CONF
    from cyborg.db import api as dbapi
    from cyborg.db.sqlalchemy import api as sa_api
    from cyborg.db.sqlalchemy import models

    CONF([], project="cyborg", default_config_files=[])
    CONF.set_override("connection", url, group="database")
    api = dbapi.get_instance()
    ctx = context.get_admin_context()

    def rp(name: str) -> str:  # upstream's provider uuid for a deployable
        return str(uuid.uuid3(uuid.NAMESPACE_DNS, name))

    def pci(bus: str, device: str = "00", function: str = "0", **extra) -> str:
        info = {"bus": bus, "device": device, "domain": "0000", "function": function, **extra}
        return json.dumps(dict(sorted(info.items())))

    with sa_api.main_context_manager.writer.using(ctx):
        def device(host, type_, vendor, model, bus, **values):
            dev = api.device_create(ctx, {
                "type": type_, "vendor": vendor, "model": model, "hostname": host,
                "std_board_info": json.dumps({"device_id": model, "class": "accelerator"}),
                "vendor_board_info": values.pop("vendor_board_info", None),
                "status": values.pop("status", "enabled"), **values})
            cpid = api.control_path_create(ctx, {"device_id": dev.id, "cpid_type": "PCI",
                                                 "cpid_info": pci(bus)})
            return dev, cpid

        def deployable(dev, name, num, driver, attrs):
            dep = api.deployable_create(ctx, {"name": name, "num_accelerators": num,
                                              "device_id": dev.id, "rp_uuid": rp(name),
                                              "driver_name": driver})
            for key, value in attrs:
                api.attribute_create(ctx, {"deployable_id": dep.id, "key": key,
                                           "value": value})
            return dep

        def handle(dep, cpid, attach_type, info, in_use=False):
            return api.attach_handle_create(ctx, {
                "deployable_id": dep.id, "cpid_id": cpid.id, "attach_type": attach_type,
                "attach_info": info, "in_use": in_use})

        fake, fake_cpid = device("compute-01", "FPGA", "0xABCD", "miss model info", "0c",
                                 vendor_board_info="fake_vendor_info")
        fpga = deployable(fake, "compute-01_FakeDevice", 16, "fake",
                          [("traits1", "CUSTOM_FAKE_DEVICE"), ("rc", "FPGA"),
                           ("owner", "team-accel")])  # the last one an operator's
        fpga_handles = [handle(fpga, fake_cpid, "TEST_PCI",
                               pci("0c", f"{fn // 8:02x}", str(fn % 8)), in_use=fn in (1, 2))
                        for fn in range(1, 17)]

        t4, t4_cpid = device("compute-02", "GPU", "10de", "1eb8", "3b")
        pgpu = deployable(t4, "compute-02_0000:3b:00.0", 1, "NVIDIA",
                          [("rc", "PGPU"), ("trait0", "OWNER_CYBORG"),
                           ("trait1", "CUSTOM_NVIDIA_1EB8")])
        pgpu_handle = handle(pgpu, t4_cpid, "PCI", pci("3b"), in_use=True)

        vt4, vt4_cpid = device("compute-02", "GPU", "10de", "1eb8", "af")
        vgpu = deployable(vt4, "compute-02_0000:af:00.0", 4, "NVIDIA",
                          [("rc", "VGPU"), ("trait0", "OWNER_CYBORG"),
                           ("trait1", "CUSTOM_NVIDIA_1EB8_T4_2B")])
        vgpu_handles = [handle(vgpu, vt4_cpid, "MDEV",
                               pci("af", asked_type="nvidia-223", vgpu_mark=f"nvidia-223_{i}"),
                               in_use=i == 0) for i in range(4)]

        ssd, ssd_cpid = device("compute-02", "SSD", "1bd4", "1001", "5e",
                               device_state="cleaning")
        nvme = deployable(ssd, "compute-02_0000:5e:00.0", 1, "inspur_nvme_ssd",
                          [("rc", "CUSTOM_SSD"), ("trait0", "CUSTOM_SSD_INSPUR"),
                           ("trait1", "CUSTOM_SSD_PRODUCT_ID_1001")])
        handle(nvme, ssd_cpid, "PCI", pci("5e"))

        def profile(name, groups, description=None):
            return api.device_profile_create(ctx, {
                "name": name, "profile_json": json.dumps({"groups": groups}),
                "description": description})

        fpga_dp = profile("fpga-dp", [{"resources:FPGA": "1",
                                       "trait:CUSTOM_FAKE_DEVICE": "required"}])
        gpu_dp = profile("gpu-dp", [{"resources:PGPU": "1",
                                     "trait:CUSTOM_NVIDIA_1EB8": "required"}],
                         "A whole Tesla T4")
        vgpu_dp = profile("vgpu-dp", [{"resources:VGPU": "1"}, {"resources:VGPU": "1"}],
                          "Two T4-2B vGPUs")

        project = "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5"
        vm1, vm2, vm3 = (str(uuid.uuid4()) for _ in range(3))

        def arq(dp, state, group=0, host=None, rp_uuid=None, instance=None, handle=None,
                dep=None):
            return api.extarq_create(ctx, {
                "device_profile_id": dp.id, "device_profile_group_id": group,
                "state": state, "project_id": project, "hostname": host,
                "device_rp_uuid": rp_uuid, "instance_uuid": instance,
                "attach_handle_id": handle.id if handle else None,
                "deployable_id": dep.id if dep else None})

        arq(fpga_dp, "Bound", host="compute-01", rp_uuid=fpga.rp_uuid, instance=vm1,
            handle=fpga_handles[0], dep=fpga)
        arq(gpu_dp, "Bound", host="compute-02", rp_uuid=pgpu.rp_uuid, instance=vm2,
            handle=pgpu_handle, dep=pgpu)
        arq(vgpu_dp, "Bound", 0, "compute-02", vgpu.rp_uuid, vm2, vgpu_handles[0], vgpu)
        # Its bind in progress when upstream stopped: the handle already picked.
        arq(vgpu_dp, "BindStarted", 1, "compute-02", vgpu.rp_uuid, vm2, vgpu_handles[1],
            vgpu)
        arq(fpga_dp, "BindStarted", host="compute-01", rp_uuid=fpga.rp_uuid, instance=vm3,
            handle=fpga_handles[1], dep=fpga)
        arq(fpga_dp, "Initial")
        arq(gpu_dp, "Unbound")
        arq(fpga_dp, "BindFailed", host="compute-01", rp_uuid=fpga.rp_uuid,
            instance=str(uuid.uuid4()))
        arq(gpu_dp, "Deleting")

        usage = models.QuotaUsage(project_id=project, user_id="u1", resource="accelerator",
                                  in_use=5, reserved=0)
        ctx.session.add(usage)


if __name__ == "__main__":
    main(sys.argv[1])
    cfg.CONF.reset()
