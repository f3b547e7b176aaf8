"""The driver guide's out-of-tree example, run the two ways the guide describes.

The package under docs/examples/acceld-example-driver is made importable with
a generated ``.dist-info`` whose ``entry_points.txt`` comes from the example's
own pyproject.toml, so the entry-point mechanism finds it exactly as it would
after ``pip install`` (without the cost of a build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import jsonschema
import pytest
import requests

from acceld import config
from acceld.clients.internal import InternalClient, InternalError
from acceld.internal import auth
from acceld.drivers import loader
from tests.support.driver_processes import read_url, stop
from tests.support.sysfs_fixtures import SysfsTree

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "acceld-example-driver"
SCHEMA = json.loads((REPO / "docs" / "hardware-record.schema.json").read_text())
SECRET = "example-driver-test-secret-0123456789"
# The driver process holds only its node's key, as an operator provisions a node.
NODE_KEY = auth.node_key(SECRET.encode(), "node7")
DSA, UNBOUND = "0000:6a:01.0", "0000:e7:01.0"


def install_example(site: Path) -> Path:
    """The example as an installed distribution in ``site``: package plus dist-info."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    shutil.copytree(EXAMPLE / "acceld_example_driver", site / "acceld_example_driver")
    dist = site / f"acceld_example_driver-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = [f"[{group}]" + "".join(f"\n{name} = {target}" for name, target in eps.items())
             for group, eps in project["entry-points"].items()]
    (dist / "entry_points.txt").write_text("\n\n".join(lines) + "\n")
    return site


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = install_example(tmp_path / "site")
    monkeypatch.syspath_prepend(str(path))
    yield path
    for name in [m for m in sys.modules if m.startswith("acceld_example_driver")]:
        del sys.modules[name]


@pytest.fixture
def conf_file(tmp_path) -> Path:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(DSA, "0x8086", "0x0b25", "0x088000", driver="idxd", iommu_group=3)
    tree.add_pci(UNBOUND, "0x8086", "0x0b25", "0x088000")
    tree.add_pci("0000:6b:00.0", "0x8086", "0x4940", "0x0b4000", driver="4xxx")  # not chosen
    path = tmp_path / "acceld.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path}\nhost = node7\n"
                    f"[internal]\nnode_key = {NODE_KEY.decode()}\n"
                    f"[example_driver]\nsysfs_root = {tree.root}\npci_ids = 8086:0b25\n")
    return path


def test_entry_point_loads_and_records_validate(site, conf_file):
    assert "example" in loader.available()
    cls = loader.driver_class("example")
    assert cls.name == "example" and cls.__module__ == "acceld_example_driver.driver"
    conf = config.load(conf=config.cfg.ConfigOpts(), config_files=[str(conf_file)])
    records = [r.to_dict() for r in loader.load("example", conf, conf.host).discover()]
    for record in records:
        jsonschema.validate(record, SCHEMA)
    assert [(r["deployables"][0]["name"], r["acc_status"]) for r in records] == [
        (DSA, "ready"), (UNBOUND, "setup_required")]
    assert records[0]["deployables"][0]["attributes"] == {
        "rc": "CUSTOM_EXAMPLE", "trait0": "CUSTOM_EXAMPLE", "trait1": "CUSTOM_EXAMPLE_8086_0B25"}


@pytest.mark.integration
def test_runs_as_an_external_driver_process(site, conf_file, tmp_path):
    acceld = Path(sys.executable).parent / "acceld"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    # Its agent is not running: the process keeps serving and retries its hello.
    argv = [str(acceld), "driver", "example", "--config-file", str(conf_file),
            "--agent-url", "http://127.0.0.1:9"]
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                            cwd=tmp_path)
    try:
        url = read_url(proc, time.monotonic() + 60, "example")
        client = InternalClient(url, auth.Signer(NODE_KEY, "node7"),
                                destination=auth.driver_destination(url))
        answer = client.call("GET", "/hardware")
        for record in answer["hardware"]:
            jsonschema.validate(record, SCHEMA)
        assert [r["deployables"][0]["name"] for r in answer["hardware"]] == [DSA, UNBOUND]
        assert client.call("POST", "/discovery") == {"status": "IN-PROGRESS"}
        # Without a credential, or with a wrong one, the Driver API refuses.
        assert requests.get(f"{url}/hardware", timeout=10).status_code == 401
        wrong = InternalClient(url, b"not-the-secret", destination=auth.driver_destination(url))
        with pytest.raises(InternalError) as refused:
            wrong.call("GET", "/hardware")
        assert refused.value.status == 401
    finally:
        stop(proc)
        log.close()
