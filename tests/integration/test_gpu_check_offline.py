"""bench/gpu_discovery_check.sh end to end, offline (issue 17).

From an export of the checkout (what travels to a GPU machine: tracked files and untracked
ones git does not ignore), with pip unable to reach any index and Python started without
site-packages (``-S``), against a fake ``nvidia-smi`` and a fixture /sys. pynvml comes from
a wheel in ``bench/wheelhouse`` (the make target's output), here a stand-in wheel wrapping
the fake pynvml.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.sysfs_fixtures import SysfsTree

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
H200 = "0000:3b:00.0"
GIB = 1024 ** 3
FAKE_PYNVML = '''"""Stand-in pynvml for the offline check test: the fake, GPUs from a JSON spec."""
import json, os, sys
from tests.support.fake_pynvml import FakeGpu, make_pynvml
with open(os.environ["FAKE_PYNVML_SPEC"]) as f:
    gpus = json.load(f)
for g in gpus:  # JSON keys are strings; GPU instance ids are ints
    g["gpu_instances"] = {int(k): v for k, v in g.get("gpu_instances", {}).items()}
sys.modules[__name__] = make_pynvml([FakeGpu(**g) for g in gpus])
'''


SPEC = [{"bus_id": H200, "device_id": 0x2335, "name": "NVIDIA H200",
         "uuid": "GPU-0e8f1c3a-5b7d-4c2e-9a1f-3d6b8e0c2a47", "memory_total": 141 * GIB,
         "mig_mode": [0, 0], "remapped_rows": [0, 0, 0, 0]}]


def export_checkout(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
        capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    shutil.rmtree(dest / "bench" / "wheelhouse", ignore_errors=True)  # built below
    return dest


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """The exported checkout, a fixture /sys, fake tools and an environment without pip."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to export the checkout")
    base = tmp_path_factory.mktemp("gpu-check")
    checkout = export_checkout(base / "checkout")
    tree = SysfsTree(base / "sys")
    tree.add_pci(H200, "0x10de", "0x2335", "0x030200", driver="nvidia", iommu_group=21)
    # Another container's H200 (bound to nvidia, invisible to this NVML), an NVSwitch and
    # a GPU passed through with vfio-pci (invisible to nvidia-smi).
    tree.add_pci("0000:9b:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia")
    tree.add_pci("0000:05:00.0", "0x10de", "0x22a3", "0x068000", driver="nvidia")
    tree.add_pci("0000:65:00.0", "0x10de", "0x2331", "0x030200", driver="vfio-pci")
    tree.add_module_version("nvidia", "570.86.15")
    spec = base / "nvml.json"
    spec.write_text(json.dumps(SPEC))
    wheelhouse = checkout / "bench" / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    with zipfile.ZipFile(wheelhouse / "nvidia_ml_py-13.615.71-py3-none-any.whl", "w") as wheel:
        wheel.writestr("pynvml.py", FAKE_PYNVML)
    bin_dir = base / "bin"
    executable(bin_dir / "python3", f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    executable(bin_dir / "pip", "#!/bin/sh\necho 'pip must not be needed' >&2\nexit 99\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", PIP_NO_INDEX="1",
               PIP_INDEX_URL="http://127.0.0.1:9/simple", http_proxy="http://127.0.0.1:9",
               https_proxy="http://127.0.0.1:9", SYSFS_ROOT=str(tree.root),
               FAKE_PYNVML_SPEC=str(spec), NODE="gpu-node", PYTHON=str(bin_dir / "python3"))
    return {"checkout": checkout, "bin": bin_dir, "env": env, "base": base}


def fake_nvidia_smi(machine, csv: str, remapped: str | None = None,
                    lgi: str | None = None) -> None:
    """nvidia-smi answering ``--query-gpu`` with ``csv`` (whatever fields are asked: an
    older one's answer), ``--query-remapped-rows`` with ``remapped`` and ``mig -lgi`` with
    ``lgi`` (exit 2 when unset, as for an unknown option or a refusal). Any other
    argument (a change of configuration) is recorded and fails."""
    executable(machine["bin"] / "nvidia-smi", "#!/bin/sh\n"
               'echo "$*" >> "$SMI_CALLS"\n'
               'case "$*" in\n'
               '  *--query-gpu*) printf \'%s\' "$CSV" ;;\n'
               '  *--query-remapped-rows*) [ -n "$REMAPPED" ] || exit 2; printf \'%s\' "$REMAPPED" ;;\n'
               '  "mig -lgi") [ -n "$LGI" ] || exit 2; printf \'%s\' "$LGI" ;;\n'
               '  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-0e8f1c3a)" ;;\n'
               '  *) exit 2 ;;\n'
               'esac\n')
    machine["env"].update(CSV=csv, REMAPPED=remapped or "", LGI=lgi or "",
                          SMI_CALLS=str(machine["base"] / "smi-calls.log"))


def run_check(machine, out: Path) -> subprocess.CompletedProcess:
    env = dict(machine["env"], OUT=str(out))
    return subprocess.run(["bash", str(machine["checkout"] / "bench" / "gpu_discovery_check.sh")],
                          env=env, capture_output=True, text=True, timeout=300)


GOOD_CSV = ("pci.bus_id, name, memory.total [MiB]\n"
            "00000000:3B:00.0, NVIDIA H200, 144384 MiB\n")


def test_check_passes_offline_and_writes_its_results_to_out(machine, tmp_path):
    fake_nvidia_smi(machine, GOOD_CSV)
    done = run_check(machine, tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU DISCOVERY CHECK PASSED" in done.stdout
    assert "pynvml: wheelhouse (nvidia_ml_py-13.615.71-py3-none-any.whl)" in done.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["passed"] is True and summary["gpus"] == [H200]
    assert summary["seconds"] < 300
    assert any("0000:65:00.0: bound to vfio-pci" in n for n in summary["notes"])
    assert any("0000:9b:00.0" in n for n in summary["notes"])  # /sys shows it; not ours
    with_nvml = json.loads((tmp_path / "out" / "with_nvml.json").read_text())["hardware"]
    assert sorted(r["vendor_board_info"]["discovered_by"] for r in with_nvml) == [
        "nvml", "sysfs"]
    for name in ("without_nvml.json", "nvidia_smi.csv", "machine.txt", "check.log"):
        assert (tmp_path / "out" / name).is_file()


def test_check_fails_when_the_driver_and_nvidia_smi_disagree(machine, tmp_path):
    fake_nvidia_smi(machine, GOOD_CSV.replace("144384", "143771")
                    + "00000000:9B:00.0, NVIDIA H200, 144384 MiB\n")
    done = run_check(machine, tmp_path / "out")
    assert done.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failures"] == [
        "0000:3b:00.0: memory 144384 MiB, nvidia-smi says 143771 MiB",
        "0000:9b:00.0: listed by nvidia-smi, not reported by the driver"]


def test_without_pynvml_the_sysfs_checks_still_run(machine, tmp_path):
    """A clean checkout has no bench/wheelhouse (git ignores it): the NVML part is skipped
    and said so, the sysfs checks run and decide; --require-nvml (REQUIRE_NVML=1) fails."""
    fake_nvidia_smi(machine, FULL_CSV)
    wheel = machine["checkout"] / "bench" / "wheelhouse"
    moved = machine["base"] / "wheelhouse-away"
    wheel.rename(moved)
    try:
        done = run_check(machine, tmp_path / "out")
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        machine["env"]["REQUIRE_NVML"] = "1"
        required = run_check(machine, tmp_path / "required")
    finally:
        machine["env"].pop("REQUIRE_NVML", None)
        moved.rename(wheel)
    assert done.returncode == 0, done.stdout + done.stderr
    assert summary["nvml_checked"] is False
    assert any("NVML part skipped" in n and "make gpu-wheelhouse" in n
               for n in summary["notes"])
    assert (tmp_path / "out" / "without_nvml.json").is_file()
    assert required.returncode == 1 and "make gpu-wheelhouse" in required.stdout


def test_sysfs_checks_catch_a_wrong_product_id_without_nvml(machine, tmp_path):
    fake_nvidia_smi(machine, FULL_CSV.replace("0x233510DE", "0x233110DE"))
    wheel = machine["checkout"] / "bench" / "wheelhouse"
    moved = machine["base"] / "wheelhouse-away"
    wheel.rename(moved)
    try:
        done = run_check(machine, tmp_path / "out")
    finally:
        moved.rename(wheel)
    assert done.returncode == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failures"] == [
        "0000:3b:00.0: product 0x2335, nvidia-smi's pci.device_id 0x233110DE says 0x2331 "
        "(sysfs run)"]


FULL_CSV = ("index, pci.bus_id, name, memory.total [MiB], pci.device_id, mig.mode.current, "
            "mig.mode.pending, ecc.errors.uncorrected.volatile.total\n"
            "0, 00000000:3B:00.0, NVIDIA H200, 144384 MiB, 0x233510DE, Disabled, Disabled, 0\n")
REMAPPED = ("gpu_bus_id, remapped_rows.correctable, remapped_rows.uncorrectable, "
            "remapped_rows.pending, remapped_rows.failure\n00000000:3B:00.0, 0, 0, No, No\n")


def test_expected_values_against_nvidia_smi(machine, tmp_path):
    fake_nvidia_smi(machine, FULL_CSV, remapped=REMAPPED)
    done = run_check(machine, tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["nvml_checked"] is True
    assert not any("did not answer" in n for n in summary["notes"]), summary["notes"]
    # Read-only: only queries were asked of nvidia-smi.
    calls = (machine["base"] / "smi-calls.log").read_text().splitlines()
    assert calls and all(c.startswith(("--query-", "-L", "mig -lgi")) for c in calls), calls


def test_expected_value_mismatches_fail(machine, tmp_path):
    csv = FULL_CSV.replace("Disabled, Disabled, 0", "Enabled, Enabled, 3")
    fake_nvidia_smi(machine, csv, remapped=REMAPPED.replace("0, 0, No, No", "2, 1, Yes, No"))
    done = run_check(machine, tmp_path / "out")
    assert done.returncode == 1
    failures = json.loads((tmp_path / "out" / "summary.json").read_text())["failures"]
    assert failures == [
        "0000:3b:00.0: mig_mode 'disabled', nvidia-smi says 'Enabled'",
        "0000:3b:00.0: MIG mode at the next reset 'disabled', nvidia-smi says 'enabled'",
        "0000:3b:00.0: ecc_volatile_uncorrected 0, nvidia-smi says 3",
        "0000:3b:00.0: remapped_rows_correctable 0, nvidia-smi says 2",
        "0000:3b:00.0: remapped_rows_uncorrectable 0, nvidia-smi says 1",
        "0000:3b:00.0: row_remap_pending 0, nvidia-smi says 1"]


LGI = """+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.18gb         19        1          0:1     |
+-------------------------------------------------------+
|   0  MIG 2g.35gb         14        2          2:2     |
+-------------------------------------------------------+
"""


def test_mig_instances_against_nvidia_smi_mig_lgi(machine, tmp_path):
    """MIG on, two GPU instances without compute instances (nvidia-smi mig -cgi 19,14)."""
    spec = machine["base"] / "nvml.json"
    mig = [dict(SPEC[0], mig_mode=[1, 1], mig_slots=[None] * 7,
                gpu_instances={"1": 19, "2": 14})]
    spec.write_text(json.dumps(mig))
    csv = FULL_CSV.replace("Disabled, Disabled", "Enabled, Enabled")
    try:
        fake_nvidia_smi(machine, csv, remapped=REMAPPED, lgi=LGI)
        done = run_check(machine, tmp_path / "out")
        assert done.returncode == 0, done.stdout + done.stderr
        notes = json.loads((tmp_path / "out" / "summary.json").read_text())["notes"]
        assert any("not offered whole: 2 MIG GPU instance(s)" in n for n in notes), notes
        fake_nvidia_smi(machine, csv, remapped=REMAPPED, lgi=LGI.replace("   14   ", "   15   "))
        done = run_check(machine, tmp_path / "bad")
        failures = json.loads((tmp_path / "bad" / "summary.json").read_text())["failures"]
        assert failures == ["0000:3b:00.0: GPU instances (id, profile) [(1, 19), (2, 14)], "
                            "nvidia-smi mig -lgi says [(1, 19), (2, 15)]"]
    finally:
        spec.write_text(json.dumps(SPEC))
