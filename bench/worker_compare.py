"""Compare API worker layouts on SQLite: one `acceld api` per layout, same load, same data.

    .venv/bin/python -m bench.worker_compare [--seconds 5] [--rounds 2]
        [--layout WORKERS:THREADS ...] [--baseline-tree DIR [--baseline-layout W:T]]

Each layout serves a fresh state directory holding 100 device profiles; the
load generator (bench/loadgen.py, 4 processes, each keeping its connection
alive as keystoneauth clients do) runs the version document, a list of the 100
profiles (every round of those first), then a profile create, for
``--seconds`` each, layouts alternated ``--rounds`` times. Reported per layout
and workload: requests per second of each round, the median latency, and the
API processes' CPU (master and workers, from /proc) per request.
``--baseline-tree`` names a checkout whose `acceld api` is run as an extra layout
("baseline": its defaults, or ``--baseline-layout``), e.g. the commit before a
worker change. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import requests

from bench import loadgen
from tests.support.net import free_port

HEADERS = {"X-User-Id": "bench", "X-Project-Id": "bench", "X-Roles": "admin,member,reader"}
PROFILES = 100


def _profile(name: str) -> dict:
    return {"name": name, "groups": [{"resources:FPGA": "1"}]}


def start(layout: str, state: str, tree: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    conf = os.path.join(state, "acceld.conf")
    with open(conf, "w") as handle:
        handle.write(f"[DEFAULT]\nstate_path = {state}\n[api]\nport = {port}\n")
        if layout:
            workers, threads = layout.split(":")
            handle.write(f"workers = {workers}\nthreads = {threads}\n")
    cwd = tree or os.getcwd()
    subprocess.run([sys.executable, "-m", "acceld.cli", "db", "upgrade", "--config-file", conf],
                   check=True, capture_output=True, cwd=cwd)
    proc = subprocess.Popen([sys.executable, "-m", "acceld.cli", "api", "--config-file", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/accelerator/v2"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"acceld api ({layout}) did not start")
        time.sleep(0.1)
    for i in range(PROFILES):
        requests.post(f"{url}/device_profiles", json=[_profile(f"seed-{i}")], headers=HEADERS,
                      timeout=10).raise_for_status()
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its children (a gunicorn master and its workers)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                              text=True).stdout.split()
    total = 0
    for proc in [str(pid), *children]:
        try:
            with open(f"/proc/{proc}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def version_document(client: loadgen.Client, index: int, iteration: int) -> None:
    if client.request("GET", "/").status != 200:
        raise loadgen.HttpError("version document failed")


def list_profiles(client: loadgen.Client, index: int, iteration: int) -> None:
    if client.request("GET", "/device_profiles").status != 200:
        raise loadgen.HttpError("list failed")


def create_profile(client: loadgen.Client, index: int, iteration: int) -> None:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    if client.request("POST", "/device_profiles", [_profile(name)]).status != 201:
        raise loadgen.HttpError("create failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layout", action="append", default=[],
                        help="WORKERS:THREADS (repeatable; default 1:4 and 2:4)")
    parser.add_argument("--baseline-tree", help="a checkout to run as the 'baseline' layout")
    parser.add_argument("--baseline-layout", default="",
                        help="WORKERS:THREADS for the baseline (default: its own defaults)")
    args = parser.parse_args()
    layouts = args.layout or ["1:4", "2:4"]
    if args.baseline_tree:
        layouts = ["baseline", *layouts]
    results: dict[tuple[str, str], list[tuple[loadgen.Result, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for layout in layouts:
                state = os.path.join(tmp, layout.replace(":", "x"))
                os.makedirs(state)
                baseline = layout == "baseline"
                tree = args.baseline_tree if baseline else None
                servers[layout] = start(args.baseline_layout if baseline else layout,
                                        state, tree)
            # Every list round before any create: creates would lengthen the list.
            for name, op in (("version document", version_document),
                             ("list 100 profiles", list_profiles),
                             ("create profile", create_profile)):
                for _ in range(args.rounds):
                    for layout, (proc, url) in servers.items():
                        before = cpu_seconds(proc.pid)
                        result = loadgen.run(name, url, op, headers=HEADERS,
                                             max_ops=1_000_000, max_seconds=args.seconds)
                        cpu_us = (cpu_seconds(proc.pid) - before) / max(1, result.ops) * 1e6
                        results.setdefault((layout, name), []).append((result, cpu_us))
        finally:
            for proc, _url in servers.values():
                stop(proc)
    print(f"{'layout':10} {'workload':20} {'req/s per round':24} {'p50 ms':>8} "
          f"{'CPU us/req':>11} errors")
    for (layout, name), runs in results.items():
        rates = ", ".join(f"{r.rate:,.0f}" for r, _ in runs)
        p50 = sorted(r.p50_ms for r, _ in runs)[len(runs) // 2]
        cpu = sorted(c for _, c in runs)[len(runs) // 2]
        errors = sum(r.errors for r, _ in runs)
        print(f"{layout:10} {name:20} {rates:24} {p50:8.2f} {cpu:11.0f} {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
