"""The nvidia_gpu driver checked against ``nvidia-smi`` and sysfs where the GPUs are, offline.

Runs the driver straight from this checkout with the standard library alone (the driver
package needs nothing else; oslo.config is replaced by the few options it reads), with
sysfs only and, when ``pynvml`` is at hand, with NVML, and checks expected values, not only
that two runs agree. Read-only: it runs discovery (which reads) and ``nvidia-smi``'s query
commands; it never changes a GPU's configuration.

Always (sysfs only, no pynvml needed), for every GPU ``nvidia-smi --query-gpu`` lists:

- it is reported, as vendor ``0x10de`` and product ``nvidia-smi``'s ``pci.device_id``
  (``0x233510DE`` -> ``0x2335``);
- offered whole, with upstream Cyborg's resource class ``PGPU`` and trait
  ``CUSTOM_NVIDIA_<PRODUCT_ID>``, one ``PCI`` attach handle naming its own address (or,
  when not offered, the reason is noted);
- its ``iommu_group`` is the one ``/sys/bus/pci/devices/<address>/iommu_group`` links to;
- nothing more is reported than nvidia-smi lists, but GPUs bound to vfio-pci (invisible
  to nvidia-smi) and GPUs NVML says are not this node's (noted).

With NVML (``pynvml`` from the system, else from a wheel in ``bench/wheelhouse``: ``make
gpu-wheelhouse`` where an index is reachable; without it this part is skipped and noted,
or fails with ``--require-nvml``):

- names and memory as nvidia-smi says, and the same identity (uuid, model, resource
  classes, deployables, traits) as the sysfs run;
- MIG mode (current and pending) against ``mig.mode.current``/``mig.mode.pending``, and the
  GPU instances against ``nvidia-smi mig -lgi`` (when it answers);
- volatile uncorrected ECC errors against ``ecc.errors.uncorrected.volatile.total`` and the
  remapped-row counters against ``nvidia-smi --query-remapped-rows``.

A field an older ``nvidia-smi`` does not know, or answers ``[N/A]``/``[Not Supported]``, is
not checked (noted once). Results go to ``--out`` (``$OUT`` in the wrapper
``bench/gpu_discovery_check.sh``). Exit status 0 when every check holds.
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
import re
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


BASIC_FIELDS = ["pci.bus_id", "name", "memory.total"]
EXTRA_FIELDS = ["index", "pci.device_id", "mig.mode.current", "mig.mode.pending",
                "ecc.errors.uncorrected.volatile.total"]
REMAPPED_FIELDS = ["gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                   "remapped_rows.pending", "remapped_rows.failure"]
_UNANSWERED = ("[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "")


def _address(bus_id: str) -> str:
    return bus_id.strip().lower()[-12:]  # '00000000:3B:00.0' -> '0000:3b:00.0'


def _csv_rows(text: str) -> list[dict[str, str]]:
    """nvidia-smi's ``--format=csv`` output by column name (units dropped from the header:
    ``memory.total [MiB]`` -> ``memory.total``)."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    if not rows:
        return []
    header = [cell.split(" [")[0].strip() for cell in rows[0]]
    return [dict(zip(header, (cell.strip() for cell in row))) for row in rows[1:]
            if len(row) >= len(header)]


def _run(command: list[str], timeout: float) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          check=True).stdout


def query_nvidia_smi(command: str, timeout: float) -> tuple[dict[str, dict[str, Any]], str]:
    """nvidia-smi's GPUs by sysfs address, with every field it answered; the raw CSV.

    The full field list first; an nvidia-smi that refuses one of them (an older release)
    is asked for the basic fields alone."""
    try:
        out = _run([command, "--query-gpu=" + ",".join(BASIC_FIELDS + EXTRA_FIELDS),
                    "--format=csv"], timeout)
    except subprocess.CalledProcessError:
        out = _run([command, "--query-gpu=" + ",".join(BASIC_FIELDS), "--format=csv"], timeout)
    gpus: dict[str, dict[str, Any]] = {}
    for row in _csv_rows(out):
        if "pci.bus_id" not in row:
            continue
        fields = {k: v for k, v in row.items() if v.lower() not in _UNANSWERED}
        if "memory.total" in fields:
            fields["memory_mib"] = int(fields["memory.total"].split()[0])
        gpus[_address(row["pci.bus_id"])] = fields
    return gpus, out


def query_remapped_rows(command: str, timeout: float) -> dict[str, dict[str, str]] | None:
    """``--query-remapped-rows`` by address; None when nvidia-smi does not answer it."""
    try:
        out = _run([command, "--query-remapped-rows=" + ",".join(REMAPPED_FIELDS),
                    "--format=csv"], timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = {_address(r["gpu_bus_id"]): r for r in _csv_rows(out) if "gpu_bus_id" in r}
    return rows or None


_LGI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s+\|")


def query_gpu_instances(command: str, timeout: float) -> dict[str, list[tuple[int, int]]] | None:
    """``nvidia-smi mig -lgi``: (GPU instance id, profile id) by GPU index (as a string);
    None when it does not answer (no MIG GPU, no permission)."""
    try:
        out = _run([command, "mig", "-lgi"], timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    found: dict[str, list[tuple[int, int]]] = {}
    for line in out.splitlines():
        match = _LGI_ROW.match(line)
        if match:
            gpu, _name, profile, instance = match.groups()
            found.setdefault(gpu, []).append((int(instance), int(profile)))
    return found


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("yes", "true"):
        return 1
    if value in ("no", "false"):
        return 0
    try:
        return int(value)
    except ValueError:
        return None


def options(sysfs_root: str, use_nvml: bool) -> types.SimpleNamespace:
    """The [nvidia_gpu] options the driver reads, at their defaults (acceld/conf/drivers.py)."""
    from acceld.drivers.nvidia_health import DEFAULT_IGNORED_XIDS

    group = types.SimpleNamespace(sysfs_root=sysfs_root, use_nvml=use_nvml,
                                  enabled_vgpu_types=[], vgpu_max_instances={},
                                  ignored_xids=list(DEFAULT_IGNORED_XIDS), proc_root="/proc")
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
    """What must not depend on NVML: uuid, model, and each deployable's rc and traits (but
    the NVLink fabric clique's, which only NVML tells a fresh driver: the agent keeps the
    last one read under its state_path)."""
    return {"uuid": record["uuid"], "model": record["model"],
            "deployables": [{"name": d["name"], "rc": d["attributes"].get("rc"),
                             "traits": sorted(v for k, v in d["attributes"].items()
                                              if k.startswith("trait")
                                              and not v.startswith("CUSTOM_NVIDIA_FABRIC_"))}
                            for d in record["deployables"]]}


def _offer_checks(address: str, record: dict[str, Any], expected: dict[str, Any],
                  sysfs_root: str) -> tuple[list[str], list[str]]:
    """Expected values of one GPU's record from either run: ids, offer, handle, group."""
    failures: list[str] = []
    notes: list[str] = []
    board = record["std_board_info"]
    if record.get("vendor") != "0x10de" or board.get("vendor_id") != "0x10de":
        failures.append(f"{address}: vendor {record.get('vendor')}, expected 0x10de")
    pci_id = expected.get("pci.device_id")
    if pci_id:
        want = f"0x{(int(pci_id, 16) >> 16) & 0xffff:04x}"
        if board.get("product_id") != want:
            failures.append(f"{address}: product {board.get('product_id')}, nvidia-smi's "
                            f"pci.device_id {pci_id} says {want}")
    product = (board.get("product_id") or "0x")[2:].upper()
    link = os.path.join(sysfs_root, "bus", "pci", "devices", address, "iommu_group")
    group = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
    if board.get("iommu_group") != group:
        failures.append(f"{address}: iommu_group {board.get('iommu_group')!r}, sysfs links "
                        f"{group!r}")
    whole = [d for d in record["deployables"] if d["attributes"].get("rc") == "PGPU"]
    if record.get("acc_status") != "ready" or not whole:
        if not record["deployables"]:
            notes.append(f"{address}: not offered whole: {record.get('acc_status')} "
                         f"({record.get('status_reason')})")
        return failures, notes
    [dep] = whole
    traits = [v for k, v in dep["attributes"].items() if k.startswith("trait")]
    if f"CUSTOM_NVIDIA_{product}" not in traits:
        failures.append(f"{address}: traits {traits} lack upstream's CUSTOM_NVIDIA_{product}")
    handles = [(h["attach_type"], h["attach_info"]) for h in dep["attach_handles"]]
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    own = ("PCI", {"domain": domain, "bus": bus, "device": device, "function": function})
    if own not in [(t, {k: i.get(k) for k in own[1]}) for t, i in handles]:
        failures.append(f"{address}: attach handles {handles} do not name the GPU as PCI "
                        f"{address}")
    return failures, notes


def _nvml_checks(address: str, record: dict[str, Any], expected: dict[str, Any],
                 remapped: dict[str, dict[str, str]] | None,
                 instances: dict[str, list[tuple[int, int]]] | None) -> list[str]:
    """What the NVML run reports beside nvidia-smi's own reading of the same NVML facts."""
    failures: list[str] = []
    info = record["vendor_board_info"]
    if info.get("discovered_by") != "nvml":
        failures.append(f"{address}: NVML run did not use NVML ({info.get('discovered_by')})")
    if info.get("name") != expected.get("name"):
        failures.append(f"{address}: name {info.get('name')!r}, nvidia-smi says "
                        f"{expected.get('name')!r}")
    if info.get("memory_mib") != expected.get("memory_mib"):
        failures.append(f"{address}: memory {info.get('memory_mib')} MiB, nvidia-smi says "
                        f"{expected.get('memory_mib')} MiB")
    current = expected.get("mig.mode.current")
    if current:
        if info.get("mig_mode") != current.lower():
            failures.append(f"{address}: mig_mode {info.get('mig_mode')!r}, nvidia-smi says "
                            f"{current!r}")
        pending = expected.get("mig.mode.pending", current).lower()
        reported = info.get("mig_mode_pending") or info.get("mig_mode")
        if reported != pending:
            failures.append(f"{address}: MIG mode at the next reset {reported!r}, nvidia-smi "
                            f"says {pending!r}")
    index = expected.get("index")
    if instances is not None and index is not None and info.get("mig_mode") == "enabled":
        want = sorted(instances.get(index, []))
        got = sorted((g["gpu_instance_id"], g["profile_id"])
                     for g in info.get("mig_gpu_instances", []))
        if got != want:
            failures.append(f"{address}: GPU instances (id, profile) {got}, nvidia-smi mig "
                            f"-lgi says {want}")
    counters = record.get("health", {}).get("counters", {})
    ecc = _number(expected.get("ecc.errors.uncorrected.volatile.total"))
    if ecc is not None and counters.get("ecc_volatile_uncorrected") != ecc:
        failures.append(f"{address}: ecc_volatile_uncorrected "
                        f"{counters.get('ecc_volatile_uncorrected')}, nvidia-smi says {ecc}")
    row = (remapped or {}).get(address)
    for field, counter in (("remapped_rows.correctable", "remapped_rows_correctable"),
                           ("remapped_rows.uncorrectable", "remapped_rows_uncorrectable"),
                           ("remapped_rows.pending", "row_remap_pending"),
                           ("remapped_rows.failure", "row_remap_failure")):
        want = _number((row or {}).get(field))
        if want is not None and counters.get(counter) != want:
            failures.append(f"{address}: {counter} {counters.get(counter)}, nvidia-smi says "
                            f"{want}")
    return failures


def compare(smi: dict[str, dict[str, Any]], with_nvml: list[dict[str, Any]] | None,
            without: list[dict[str, Any]], sysfs_root: str = "/sys",
            remapped: dict[str, dict[str, str]] | None = None,
            instances: dict[str, list[tuple[int, int]]] | None = None
            ) -> tuple[list[str], list[str]]:
    """(failures, notes). ``with_nvml`` None: the NVML part is skipped."""
    failures: list[str] = []
    notes: list[str] = []
    nvml_run = {address_of(r): r for r in with_nvml} if with_nvml is not None else None
    sysfs_run = {address_of(r): r for r in without}
    if not smi:
        failures.append("nvidia-smi lists no GPU")
    primary = nvml_run if nvml_run is not None else sysfs_run
    for address, record in sorted(primary.items()):
        if address in smi:
            continue
        if record["std_board_info"].get("driver") == "vfio-pci":
            notes.append(f"{address}: bound to vfio-pci, invisible to nvidia-smi (passthrough)")
        elif nvml_run is not None:
            failures.append(f"{address}: reported by the driver but not listed by nvidia-smi")
        else:
            notes.append(f"{address}: in /sys, not listed by nvidia-smi (another container's "
                         f"GPU? sysfs alone cannot tell)")
    for address, expected in sorted(smi.items()):
        other = sysfs_run.get(address)
        if other is None:
            failures.append(f"{address}: listed by nvidia-smi, missing from the sysfs-only run")
        else:
            found, noted = _offer_checks(address, other, expected, sysfs_root)
            failures += [f"{f} (sysfs run)" for f in found]
            notes += noted
        if nvml_run is None:
            continue
        record = nvml_run.get(address)
        if record is None:
            failures.append(f"{address}: listed by nvidia-smi, not reported by the driver")
            continue
        failures += _nvml_checks(address, record, expected, remapped, instances)
        found, _noted = _offer_checks(address, record, expected, sysfs_root)
        failures += [f"{f} (NVML run)" for f in found]
        if other is not None and identity(other) != identity(record):
            if record.get("acc_status") == "ready":
                failures.append(f"{address}: NVML and sysfs runs disagree: {identity(record)} "
                                f"vs {identity(other)}")
            elif {k: v for k, v in identity(other).items() if k != "deployables"} != \
                    {k: v for k, v in identity(record).items() if k != "deployables"}:
                failures.append(f"{address}: NVML and sysfs runs disagree on uuid or model")
            else:  # what only NVML sees (MIG instances, vGPUs) holds the offer back
                notes.append(f"{address}: offered by the sysfs run only: with NVML it is "
                             f"{record.get('acc_status')} ({record.get('status_reason')})")
        if record.get("health", {}).get("state") not in ("healthy", "unknown"):
            notes.append(f"{address}: health {record['health']}")
    if nvml_run is not None:
        extra = sorted(set(sysfs_run) - set(nvml_run))
        if extra:
            notes.append(f"in /sys but not this node's per NVML (not reported with NVML): "
                         f"{', '.join(extra)}")
    checked = set().union(*(set(g) for g in smi.values())) if smi else set()
    unchecked = [f for f in EXTRA_FIELDS if f not in checked and f != "index"]
    if unchecked:
        notes.append(f"nvidia-smi did not answer {', '.join(unchecked)}: not checked")
    if nvml_run is not None and remapped is None:
        notes.append("nvidia-smi --query-remapped-rows did not answer: remapped rows not "
                     "checked")
    return failures, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or ".",
                        help="directory for the results (default $OUT, else .)")
    parser.add_argument("--sysfs-root", default=os.environ.get("SYSFS_ROOT", "/sys"))
    parser.add_argument("--nvidia-smi", default=os.environ.get("NVIDIA_SMI", "nvidia-smi"))
    parser.add_argument("--host", default=os.environ.get("NODE") or socket.gethostname())
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds each nvidia-smi call may take")
    parser.add_argument("--require-nvml", action="store_true",
                        default=os.environ.get("REQUIRE_NVML") == "1",
                        help="fail when pynvml is missing (default: skip the NVML part)")
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
    without = discover(args.sysfs_root, args.host, None)
    save("without_nvml.json", {"driver": "nvidia_gpu", "hardware": without})
    nvml, source = import_pynvml()
    summary["pynvml"] = source
    print(f"pynvml: {source}")
    with_nvml = None
    remapped = instances = None
    extra_failures: list[str] = []
    extra_notes: list[str] = []
    if nvml is None:
        (extra_failures if args.require_nvml else extra_notes).append(
            f"NVML part skipped: {source}")
    else:
        with_nvml = discover(args.sysfs_root, args.host, nvml)
        save("with_nvml.json", {"driver": "nvidia_gpu", "hardware": with_nvml})
        remapped = query_remapped_rows(args.nvidia_smi, args.timeout)
        if any(r["vendor_board_info"].get("mig_mode") == "enabled" for r in with_nvml):
            instances = query_gpu_instances(args.nvidia_smi, args.timeout)
            if instances is None:
                extra_notes.append("nvidia-smi mig -lgi did not answer: GPU instances not "
                                   "checked")
    failures, notes = compare(smi, with_nvml, without, args.sysfs_root, remapped, instances)
    failures += extra_failures
    notes = extra_notes + notes
    summary.update(passed=not failures, failures=failures, notes=notes, gpus=sorted(smi),
                   nvml_checked=with_nvml is not None,
                   seconds=round(time.monotonic() - started, 2))
    save("summary.json", summary)
    for record in with_nvml if with_nvml is not None else without:
        info = record["vendor_board_info"]
        print(f"  {address_of(record)} {record['model']!r} name={info.get('name')!r} "
              f"memory_mib={info.get('memory_mib')} via={info.get('discovered_by')} "
              f"health={record.get('health', {}).get('state')} "
              f"deployables={[(d['name'], d['attributes'].get('rc')) for d in record['deployables']]}")
    for note in notes:
        print(f"note: {note}")
    for failure in failures:
        print(f"FAIL: {failure}")
    nvml_part = f"{len(with_nvml)} record(s) with NVML" if with_nvml is not None else \
        "NVML part skipped"
    print(f"GPU CHECK {'PASSED' if not failures else 'FAILED'}: {len(smi)} GPU(s) from "
          f"nvidia-smi, {nvml_part}, {len(without)} from sysfs only, "
          f"{summary['seconds']} s; results in {os.path.abspath(args.out)}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
