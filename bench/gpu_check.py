"""The nvidia_gpu driver checked against ``nvidia-smi`` where the GPUs are, offline.

Runs the driver straight from this checkout with the standard library alone (the driver
package needs nothing else; oslo.config is replaced by the few options it reads), first
with NVML, then with NVML off (sysfs only), and asserts:

- the NVML run reports exactly the GPUs ``nvidia-smi --query-gpu=pci.bus_id,name,
  memory.total --format=csv`` lists (no more: a container sees other GPUs in /sys; GPUs
  bound to vfio-pci, invisible to nvidia-smi, are listed apart), with the same names and
  memory;
- the sysfs run agrees with the NVML run on every such GPU's uuid, model, resource
  classes, deployables and traits.

``pynvml`` comes from the system, else from a wheel in ``bench/wheelhouse`` (``make
gpu-wheelhouse`` where an index is reachable; nvidia-ml-py is pure Python, so the wheel is
put on ``sys.path`` as it is, no pip). Results go to ``--out`` (``$OUT`` in the wrapper
``bench/gpu_discovery_check.sh``). Exit status 0 when every assertion holds.
"""

from __future__ import annotations

import argparse
import csv
import glob
import importlib
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import types
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_pynvml() -> tuple[types.ModuleType | None, str]:
    """pynvml and where it came from; (None, why) when there is none."""
    try:
        module = importlib.import_module("pynvml")
        return module, f"installed ({module.__file__})"
    except ImportError:
        pass
    for wheel in sorted(glob.glob(os.path.join(REPO, "bench", "wheelhouse",
                                               "nvidia_ml_py-*.whl")), reverse=True):
        sys.path.insert(0, wheel)
        try:
            module = importlib.import_module("pynvml")
            return module, f"wheelhouse ({os.path.basename(wheel)})"
        except ImportError:
            sys.path.remove(wheel)
    return None, ("pynvml is not installed and bench/wheelhouse holds no nvidia-ml-py wheel "
                  "(run 'make gpu-wheelhouse' where a package index is reachable)")


def query_nvidia_smi(command: str, timeout: float) -> tuple[dict[str, dict[str, Any]], str]:
    """nvidia-smi's GPUs by sysfs address: {'0000:3b:00.0': {'name':, 'memory_mib':}}."""
    out = subprocess.run(
        [command, "--query-gpu=pci.bus_id,name,memory.total", "--format=csv"],
        capture_output=True, text=True, timeout=timeout, check=True).stdout
    rows = list(csv.reader(io.StringIO(out), skipinitialspace=True))
    gpus = {}
    for row in rows[1:]:  # the first line is the header
        if len(row) < 3:
            continue
        bus_id, name, memory = (cell.strip() for cell in row[:3])
        address = bus_id.lower()[-12:]  # '00000000:3B:00.0' -> '0000:3b:00.0'
        gpus[address] = {"name": name, "memory_mib": int(memory.split()[0])}
    return gpus, out


def options(sysfs_root: str, use_nvml: bool) -> types.SimpleNamespace:
    """The [nvidia_gpu] options the driver reads, at their defaults (acceld/config.py)."""
    from acceld.drivers.nvidia_health import DEFAULT_IGNORED_XIDS

    group = types.SimpleNamespace(sysfs_root=sysfs_root, use_nvml=use_nvml,
                                  enabled_vgpu_types=[], vgpu_max_instances={},
                                  ignored_xids=list(DEFAULT_IGNORED_XIDS))
    return types.SimpleNamespace(nvidia_gpu=group)


def discover(sysfs_root: str, host: str, nvml: types.ModuleType | None) -> list[dict[str, Any]]:
    from acceld.drivers.nvidia_gpu import NvidiaGpuDriver

    driver = NvidiaGpuDriver(options(sysfs_root, nvml is not None), host,  # type: ignore[arg-type]
                             nvml=nvml)
    try:
        return [record.to_dict() for record in driver.discover()]
    finally:
        driver.close()


def address_of(record: dict[str, Any]) -> str:
    cpid = record["controlpath_id"]["cpid_info"]
    return f"{cpid['domain']}:{cpid['bus']}:{cpid['device']}.{cpid['function']}"


def identity(record: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on NVML: uuid, model, and each deployable's rc and traits."""
    return {"uuid": record["uuid"], "model": record["model"],
            "deployables": [{"name": d["name"], "rc": d["attributes"].get("rc"),
                             "traits": sorted(v for k, v in d["attributes"].items()
                                              if k.startswith("trait"))}
                            for d in record["deployables"]]}


def compare(smi: dict[str, dict[str, Any]], with_nvml: list[dict[str, Any]],
            without: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(failures, notes)."""
    failures: list[str] = []
    notes: list[str] = []
    nvml_run = {address_of(r): r for r in with_nvml}
    sysfs_run = {address_of(r): r for r in without}
    if not smi:
        failures.append("nvidia-smi lists no GPU")
    for address, record in sorted(nvml_run.items()):
        if address in smi:
            continue
        if record["std_board_info"].get("driver") == "vfio-pci":
            notes.append(f"{address}: bound to vfio-pci, invisible to nvidia-smi (passthrough)")
        else:
            failures.append(f"{address}: reported by the driver but not listed by nvidia-smi")
    for address, expected in sorted(smi.items()):
        record = nvml_run.get(address)
        if record is None:
            failures.append(f"{address}: listed by nvidia-smi, not reported by the driver")
            continue
        info = record["vendor_board_info"]
        if info.get("discovered_by") != "nvml":
            failures.append(f"{address}: NVML run did not use NVML ({info.get('discovered_by')})")
        if info.get("name") != expected["name"]:
            failures.append(f"{address}: name {info.get('name')!r}, nvidia-smi says "
                            f"{expected['name']!r}")
        if info.get("memory_mib") != expected["memory_mib"]:
            failures.append(f"{address}: memory {info.get('memory_mib')} MiB, nvidia-smi says "
                            f"{expected['memory_mib']} MiB")
        other = sysfs_run.get(address)
        if other is None:
            failures.append(f"{address}: missing from the sysfs-only run")
        elif identity(other) != identity(record):
            failures.append(f"{address}: NVML and sysfs runs disagree: {identity(record)} vs "
                            f"{identity(other)}")
        if record.get("health", {}).get("state") not in ("healthy", "unknown"):
            notes.append(f"{address}: health {record['health']}")
    extra = sorted(set(sysfs_run) - set(nvml_run))
    if extra:
        notes.append(f"in /sys but not this node's per NVML (not reported with NVML): "
                     f"{', '.join(extra)}")
    return failures, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or ".",
                        help="directory for the results (default $OUT, else .)")
    parser.add_argument("--sysfs-root", default=os.environ.get("SYSFS_ROOT", "/sys"))
    parser.add_argument("--nvidia-smi", default=os.environ.get("NVIDIA_SMI", "nvidia-smi"))
    parser.add_argument("--host", default=os.environ.get("NODE") or socket.gethostname())
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds nvidia-smi may take")
    args = parser.parse_args(argv)
    # The driver says at INFO why it fell back (NVML unavailable, a GPU not visible to it).
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    sys.path.insert(0, REPO)
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()

    def save(name: str, data: Any) -> None:
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(data if isinstance(data, str) else json.dumps(data, indent=2) + "\n")

    summary: dict[str, Any] = {"python": sys.version.split()[0], "sysfs_root": args.sysfs_root}
    try:
        smi, raw = query_nvidia_smi(args.nvidia_smi, args.timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"GPU CHECK FAILED: nvidia-smi did not answer: {exc}")
        save("summary.json", {**summary, "passed": False, "failures": [f"nvidia-smi: {exc}"]})
        return 1
    save("nvidia_smi.csv", raw)
    nvml, source = import_pynvml()
    summary["pynvml"] = source
    print(f"pynvml: {source}")
    if nvml is None:
        save("summary.json", {**summary, "passed": False, "failures": [source]})
        print(f"GPU CHECK FAILED: {source}")
        return 1
    with_nvml = discover(args.sysfs_root, args.host, nvml)
    without = discover(args.sysfs_root, args.host, None)
    save("with_nvml.json", {"driver": "nvidia_gpu", "hardware": with_nvml})
    save("without_nvml.json", {"driver": "nvidia_gpu", "hardware": without})
    failures, notes = compare(smi, with_nvml, without)
    summary.update(passed=not failures, failures=failures, notes=notes,
                   gpus=sorted(smi), seconds=round(time.monotonic() - started, 2))
    save("summary.json", summary)
    for record in with_nvml:
        info = record["vendor_board_info"]
        print(f"  {address_of(record)} {record['model']!r} name={info.get('name')!r} "
              f"memory_mib={info.get('memory_mib')} via={info.get('discovered_by')} "
              f"health={record.get('health', {}).get('state')} "
              f"deployables={[(d['name'], d['attributes'].get('rc')) for d in record['deployables']]}")
    for note in notes:
        print(f"note: {note}")
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"GPU CHECK {'PASSED' if not failures else 'FAILED'}: {len(smi)} GPU(s) from "
          f"nvidia-smi, {len(with_nvml)} record(s) with NVML, {len(without)} from sysfs only, "
          f"{summary['seconds']} s; results in {os.path.abspath(args.out)}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
