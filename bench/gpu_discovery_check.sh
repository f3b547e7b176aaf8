#!/usr/bin/env bash
# The nvidia_gpu driver against nvidia-smi and sysfs, on a machine with NVIDIA GPUs, Python 3,
# the NVIDIA driver and nvidia-smi, from a clean checkout and without network. Nothing is
# installed: the driver runs from this checkout on the standard library alone
# (bench/gpu_check.py). The sysfs checks always run; the NVML checks run when pynvml is at
# hand (from the system, or from bench/wheelhouse, which git ignores: make gpu-wheelhouse
# where an index is reachable) and are skipped, and said so, when it is not
# (REQUIRE_NVML=1 makes that a failure). Read-only: discovery reads, and nvidia-smi is only
# queried (--query-gpu, --query-remapped-rows, -L, mig -lgi); no GPU setting is changed.
#
#   bash bench/gpu_discovery_check.sh            # results in $OUT when set, else a temp dir
#
# Knobs: OUT (results directory), PYTHON (default python3), NVIDIA_SMI (default
# nvidia-smi), SYSFS_ROOT (default /sys), NODE (node name for uuids; default the hostname),
# REQUIRE_NVML (1: fail without pynvml). Every step has its own timeout; the whole check
# ends within 5 minutes.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"
RESULTS="${OUT:-$(mktemp -d /tmp/acceld-gpu-check.XXXXXX)}"
mkdir -p "$RESULTS" || { echo "GPU CHECK FAILED: cannot create $RESULTS"; exit 1; }
START=$SECONDS

say() { printf '\n===== %s (t=%ss) =====\n' "$*" "$((SECONDS - START))"; }

say "machine"
{
    uname -srm
    timeout 10 "$PYTHON" --version 2>&1 || echo "no $PYTHON"
    timeout 30 "$NVIDIA_SMI" -L 2>&1 || echo "($NVIDIA_SMI -L failed)"
    timeout 30 "$NVIDIA_SMI" --query-gpu=pci.bus_id,name,memory.total,driver_version \
        --format=csv 2>&1 || true
    timeout 30 "$NVIDIA_SMI" --query-gpu=pci.bus_id,pci.device_id,mig.mode.current,mig.mode.pending,ecc.errors.uncorrected.volatile.total \
        --format=csv 2>&1 || true
    echo "NVIDIA PCI functions (vendor 0x10de) in ${SYSFS_ROOT:-/sys}/bus/pci/devices:"
    for d in "${SYSFS_ROOT:-/sys}"/bus/pci/devices/*; do
        [ "$(cat "$d/vendor" 2>/dev/null)" = "0x10de" ] || continue
        printf '  %s device=%s class=%s driver=%s\n' "$(basename "$d")" "$(cat "$d/device")" \
            "$(cat "$d/class")" "$(basename "$(readlink "$d/driver" 2>/dev/null || echo none)")"
    done
} 2>&1 | tee "$RESULTS/machine.txt"

say "nvidia_gpu with sysfs only and (when pynvml is at hand) with NVML, against nvidia-smi"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" timeout 240 "$PYTHON" "$REPO/bench/gpu_check.py" \
    --out "$RESULTS" --nvidia-smi "$NVIDIA_SMI" 2>&1 | tee "$RESULTS/check.log"
rc=${PIPESTATUS[0]}

say "done"
if [ "$rc" -eq 0 ]; then
    echo "GPU DISCOVERY CHECK PASSED (results in $RESULTS)"
else
    [ "$rc" -eq 124 ] && echo "(the check ran past its 240 s limit)"
    echo "GPU DISCOVERY CHECK FAILED (exit $rc; results in $RESULTS)"
    exit 1
fi
