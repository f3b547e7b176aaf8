"""Every hardware driver runs as `acceld driver NAME` and answers GET /hardware."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from acceld.drivers import record_schema
from tests.support.driver_processes import read_url, stop
from tests.support.sysfs_fixtures import SysfsTree, node_overrides, populate_node

SECRET = "hardware-driver-processes-0123456789"
DRIVERS = ["nvidia_gpu", "intel_fpga", "xilinx_fpga", "intel_qat", "nvme", "nic", "ascend"]


def conf_text(tmp_path: Path) -> str:
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    groups: dict[str, list[str]] = {}
    for key, value in node_overrides(tree, tmp_path).items():
        group, _, option = key.partition("__")
        if isinstance(value, list):
            text = ",".join(value)
        elif isinstance(value, dict):  # oslo.config's Dict: key:value,key:value
            text = ",".join(f"{k}:{v}" for k, v in value.items())
        elif isinstance(value, bool):
            text = str(value).lower()
        else:
            text = str(value)
        groups.setdefault(group, []).append(f"{option} = {text}")
    body = "".join(f"[{g}]\n" + "\n".join(lines) + "\n" for g, lines in groups.items())
    return (f"[DEFAULT]\nstate_path = {tmp_path}\nhost = gpu-node-1\n"
            f"[internal]\nshared_secret = {SECRET}\n" + body)


@pytest.mark.integration
def test_each_driver_serves_its_hardware(tmp_path):
    conf = tmp_path / "acceld.conf"
    conf.write_text(conf_text(tmp_path))
    acceld = Path(sys.executable).parent / "acceld"
    procs = {}
    try:
        for name in DRIVERS:  # started together: they import in parallel
            log = open(tmp_path / f"{name}.log", "w")
            procs[name] = (subprocess.Popen(
                [str(acceld), "driver", name, "--config-file", str(conf),
                 "--agent-url", "http://127.0.0.1:9"],
                stdout=subprocess.PIPE, stderr=log, text=True, cwd=tmp_path), log)
        deadline = time.monotonic() + 90
        for name, (proc, _log) in procs.items():
            url = read_url(proc, deadline, name)
            signer = auth.Signer(auth.node_key(SECRET.encode(), "gpu-node-1"), "gpu-node-1")
            answer = InternalClient(url, signer, destination=auth.driver_destination(
                url)).call("GET", "/hardware")
            records = answer["hardware"]
            assert records, f"{name} reported nothing"
            assert record_schema.check_node(records).problems == []
            assert {r["driver_name"] for r in records} == {name}
    finally:
        for proc, _log in procs.values():
            proc.terminate()
        for proc, log in procs.values():
            stop(proc)
            log.close()
