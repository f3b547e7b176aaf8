#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: install acceld with the `nvidia` extra in a fresh venv and
# print the nvidia_gpu driver's discovery as JSON, first through NVML, then with NVML turned
# off (the sysfs path), then a side-by-side summary. Finishes within 5 minutes; each step has
# its own timeout. Run from anywhere:  bash bench/gpu_discovery_check.sh
#
# Machines without PyPI access: prepare a wheelhouse where pip works, carry it along, and set
#   WHEELHOUSE=/path/to/wheels   (made with: pip download -d wheels '.[nvidia]' from the repo)
# Other knobs: PYTHON (default python3), VENV (default a temporary directory), NODE (the node
# name used for uuids; default the hostname).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$(mktemp -d /tmp/acceld-gpu-check.XXXXXX)/venv}"
NODE="${NODE:-$(hostname)}"
OUT="$(dirname "$VENV")"
START=$SECONDS

say() { printf '\n===== %s (t=%ss) =====\n' "$*" "$((SECONDS - START))"; }
fail() { printf '\nGPU DISCOVERY CHECK FAILED: %s\n' "$*"; exit 1; }

say "machine"
uname -srm
"$PYTHON" --version || fail "no $PYTHON"
if command -v nvidia-smi >/dev/null; then
    timeout 30 nvidia-smi -L || echo "(nvidia-smi -L failed)"
    timeout 30 nvidia-smi --query-gpu=pci.bus_id,name,memory.total,driver_version,mig.mode.current \
        --format=csv || true
else
    echo "nvidia-smi: not installed"
fi
echo "NVIDIA PCI functions (vendor 0x10de) in /sys/bus/pci/devices:"
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = "0x10de" ] || continue
    printf '  %s device=%s class=%s driver=%s\n' "$(basename "$d")" "$(cat "$d/device")" \
        "$(cat "$d/class")" "$(basename "$(readlink "$d/driver" 2>/dev/null || echo none)")"
done

say "venv at $VENV"
timeout 60 "$PYTHON" -m venv "$VENV" || fail "could not create a venv"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
if [ -n "${WHEELHOUSE:-}" ]; then
    PIP+=(--no-index --find-links "$WHEELHOUSE")
fi

say "pip install acceld[nvidia]"
timeout 180 "${PIP[@]}" "$REPO[nvidia]" 2>&1 | grep -v "^WARNING: Location"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "pip install did not succeed (set WHEELHOUSE on offline machines)"
"$VENV/bin/python" -c "import pynvml, acceld; print('pynvml from', pynvml.__file__)" \
    || fail "the nvidia extra did not install pynvml"

SHOW=("$VENV/bin/python" -m acceld.drivers.show nvidia_gpu --host "$NODE")
cd "$OUT" || exit 1   # run outside the repo so the installed package is what runs

say "nvidia_gpu discovery WITH NVML"
timeout 60 "${SHOW[@]}" > "$OUT/with_nvml.json"; rc_nvml=$?
cat "$OUT/with_nvml.json"
echo "(exit status $rc_nvml)"

say "nvidia_gpu discovery WITHOUT NVML (sysfs path)"
OS_NVIDIA_GPU__USE_NVML=false timeout 60 "${SHOW[@]}" > "$OUT/without_nvml.json"; rc_sysfs=$?
cat "$OUT/without_nvml.json"
echo "(exit status $rc_sysfs)"

say "summary"
timeout 30 "$VENV/bin/python" - "$OUT/with_nvml.json" "$OUT/without_nvml.json" <<'PY'
import json, sys
runs = {}
for label, path in (("nvml", sys.argv[1]), ("sysfs", sys.argv[2])):
    try:
        runs[label] = {r["uuid"]: r for r in json.load(open(path))["hardware"]}
    except Exception as exc:  # a failed run printed its reason above
        runs[label] = {}
        print(f"{label}: no usable output ({exc})")
for label, records in runs.items():
    print(f"{label}: {len(records)} GPU(s)")
    for r in records.values():
        info = r["vendor_board_info"]
        deps = [(d["name"], d["attributes"]["rc"], d["num_accelerators"],
                 sorted(v for k, v in d["attributes"].items() if k.startswith("trait")))
                for d in r["deployables"]]
        print(f"  {r['model']!r} via {info.get('discovered_by')} memory_mib={info.get('memory_mib')}"
              f" driver={info.get('driver_version')} mig={info.get('mig_mode')} deployables={deps}")
same = set(runs["nvml"]) == set(runs["sysfs"]) and bool(runs["nvml"])
nvml_used = any(r["vendor_board_info"].get("discovered_by") == "nvml"
                for r in runs["nvml"].values())
sysfs_only = all(r["vendor_board_info"].get("discovered_by") == "sysfs"
                 for r in runs["sysfs"].values())
print("same GPUs (uuids) on both paths:", "yes" if same else "NO")
print("first run used NVML:", "yes" if nvml_used else "NO (see the log lines above)")
print("second run used sysfs only:", "yes" if sysfs_only else "NO")
sys.exit(0 if same and nvml_used and sysfs_only else 1)
PY
rc_sum=$?

say "done"
if [ $rc_nvml -eq 0 ] && [ $rc_sysfs -eq 0 ] && [ $rc_sum -eq 0 ]; then
    echo "GPU DISCOVERY CHECK PASSED"
else
    echo "GPU DISCOVERY CHECK FAILED (nvml=$rc_nvml sysfs=$rc_sysfs summary=$rc_sum)"
    exit 1
fi
