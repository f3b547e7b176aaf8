"""The API worker's memory under `make bench`'s workloads, without upstream: RSS, PSS, USS.

`make bench` reports the gunicorn worker's RSS (bench/run.py); RSS counts every page the
worker maps, those it still shares with the master since the fork included. PSS splits
shared pages between the processes sharing them and USS counts only the worker's own,
so the three together say whether a saving is the worker's or the master's. Same stack
(bench/acceld_stack.py: one worker, SQLite, conductor and fake-driver agent), same data
and same workloads as bench/run.py, by import.

    PYTHONPATH=. .venv/bin/python -m bench.api_memory [--only device_list] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench import run as bench


def memory_mb(pid: int) -> dict[str, float]:
    """RSS, PSS and USS (private clean + dirty) of one process, from smaps_rollup."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {"rss": fields["Rss"] / 1024, "pss": fields["Pss"] / 1024,
            "uss": (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024}


def worker_pid(master: int) -> int:
    workers = bench.children(master)
    if len(workers) != 1:
        raise RuntimeError(f"expected one API worker under {master}, found {workers}")
    return workers[0]


def report(label: str, master: int) -> None:
    worker, main = memory_mb(worker_pid(master)), memory_mb(master)
    print(f"{label:<12} worker RSS {worker['rss']:6.1f}  PSS {worker['pss']:6.1f}  "
          f"USS {worker['uss']:6.1f} MB | master RSS {main['rss']:6.1f}  "
          f"USS {main['uss']:6.1f} MB", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run only this workload (bench/run.py's keys; repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="acceld-memory-"))
    side = bench.start_acceld(workdir / "acceld")
    try:
        bench.prepare(side)
        master = side.stack.procs["api"].pid
        report("start", master)
        if args.only:
            keep = set(args.only)
            real = bench.workloads
            bench.workloads = lambda target, devices: [  # type: ignore[assignment]
                w for w in real(target, devices) if w.key in keep]
        bench.run_workloads([side])
        report("after load", master)
    finally:
        side.stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
