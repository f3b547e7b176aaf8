"""python -m acceld.drivers.show NAME: a driver's discovery as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from acceld.drivers import show
from tests.support.sysfs_fixtures import SysfsTree, populate_node


def test_show_prints_the_records(tmp_path, capsys):
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    conf_file = tmp_path / "acceld.conf"
    conf_file.write_text(f"[nvidia_gpu]\nsysfs_root = {tree.root}\nuse_nvml = false\n")
    assert show.main(["nvidia_gpu", "--config-file", str(conf_file), "--host", "n1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["driver"] == "nvidia_gpu"
    assert [r["model"] for r in out["hardware"]] == ["NVIDIA T4", "NVIDIA H200"]


def test_show_unknown_driver(capsys):
    assert show.main(["no_such_driver"]) == 2
    assert "No driver named 'no_such_driver'" in capsys.readouterr().err


def test_show_as_a_module_with_the_environment(tmp_path):
    tree = populate_node(SysfsTree(tmp_path / "sys"))
    env = dict(os.environ, OS_INTEL_FPGA__SYSFS_ROOT=str(tree.root))
    done = subprocess.run([sys.executable, "-m", "acceld.drivers.show", "intel_fpga"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    [record] = json.loads(done.stdout)["hardware"]
    assert record["deployables"][0]["name"] == "0000:5e:00.0"
