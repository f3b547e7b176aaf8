"""CPU time of benchmarked processes, from /proc: on a shared machine wall-clock rates move
with the neighbours' load, the CPU a request or a hello costs moves far less."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (OSError once the process is gone)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()  # after the name: utime, stime
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU of ``pid`` and its live descendants (a server's master and workers); a process
    gone meanwhile counts nothing."""
    try:
        total = cpu_seconds(pid)
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    return total + sum(tree_cpu_seconds(int(child)) for child in children)
