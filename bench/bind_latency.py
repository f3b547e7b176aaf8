"""PATCH to ``Bound`` on an idle all-in-one: how long a bind with no programming or host
step takes (issue 15's fast binds).

One ARQ at a time, nothing else running: POST an ARQ, PATCH it bound to the fake
driver's deployable, and wait for what Nova waits for: the ``accelerator-request-bound``
event, received by a recording Nova endpoint in this process (tests.support.nova).
Reported: the median and 90th percentile from the PATCH being sent to the event's
arrival, and the PATCH's own answer time (it returns 202 once the conductor resolved
the bind, within ``[api] bind_wait``). Each bind is then checked with one
``GET ?instance=&bind_state=resolved``: 200 with ``Bound``, since the conductor sends
the event after the bind's commit. (Earlier versions polled that GET every millisecond
instead; the polling loaded the API and the machine's two cores, and added its own
delay to each figure.)

The recording Nova keeps connections alive (HTTP/1.1), as Nova's API under uWSGI or
Apache does for the conductor's keystoneauth session; until issue 26 it answered HTTP/1.0,
so each event also paid a TCP connection and a thread started for it in this process
(``--new-connections`` measures that way again). The CPU each acceld process used per
bind is printed too (/proc): on a shared machine it moves far less than the wall clock.

    .venv/bin/python -m bench.bind_latency [--binds 200] [--workdir DIR] [--new-connections]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import requests

from bench.acceld_stack import AcceldStack
from bench.upstream import HEADERS, HOSTNAME
from tests.support.net import free_port
from tests.support.nova import RecordingNova

DP = "bench-bind-latency"


def _cpu_seconds(stack: AcceldStack) -> dict[str, float]:
    """CPU (user + system) each acceld process and its children (the API's worker) used so
    far, from /proc: on a shared machine the wall-clock figures move with the neighbours'
    load, the CPU a bind costs does not."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                # after the name: state ppid pgrp session ... utime(12) stime(13)
                stats[int(entry.name)] = (int(fields[3]), int(fields[11]) + int(fields[12]))
    return {name: sum(ticks for session, ticks in stats.values() if session == proc.pid) / tick
            for name, proc in stack.procs.items()}


def measure(stack: AcceldStack, nova: RecordingNova, rp_uuid: str,
            binds: int) -> dict[str, float]:
    session = requests.Session()  # kept alive, as Nova's keystoneauth session
    session.headers.update(HEADERS)
    url = stack.url
    resp = session.post(f"{url}/device_profiles", timeout=30, json=[{"name": DP, "groups": [
        {"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]}])
    if resp.status_code not in (201, 409):
        raise RuntimeError(f"profile: {resp.status_code} {resp.text}")
    to_bound: list[float] = []
    patch_answer: list[float] = []
    cpu_before, own_before = _cpu_seconds(stack), time.process_time()
    for _ in range(binds):
        arq = session.post(f"{url}/accelerator_requests", json={"device_profile_name": DP},
                           timeout=30).json()["arqs"][0]
        instance = str(uuid.uuid4())
        patch = {arq["uuid"]: [{"path": "/hostname", "op": "add", "value": HOSTNAME},
                               {"path": "/device_rp_uuid", "op": "add", "value": rp_uuid},
                               {"path": "/instance_uuid", "op": "add", "value": instance}]}
        query = f"{url}/accelerator_requests?instance={instance}&bind_state=resolved"
        started = time.perf_counter()
        answer = session.patch(f"{url}/accelerator_requests", json=patch, timeout=30)
        patch_answer.append(time.perf_counter() - started)
        if answer.status_code != 202:
            raise RuntimeError(f"PATCH: {answer.status_code} {answer.text}")
        to_bound.append(nova.received_at(arq["uuid"]) - started)
        got = session.get(query, timeout=30)
        states = {a["state"] for a in got.json().get("arqs", [])} if got.ok else set()
        if got.status_code != 200 or states != {"Bound"}:
            raise RuntimeError(f"after the event: {got.status_code} {got.text[:200]}")
        session.delete(f"{url}/accelerator_requests?instance={instance}", timeout=30)
    cpu = {name: (used - cpu_before.get(name, 0.0)) * 1000 / binds
           for name, used in _cpu_seconds(stack).items()}
    cpu["bench"] = (time.process_time() - own_before) * 1000 / binds
    ordered = sorted(to_bound)
    return {"binds": binds, "p50_ms": statistics.median(to_bound) * 1000,
            "p10_ms": ordered[max(0, int(len(ordered) * 0.1) - 1)] * 1000,
            "p90_ms": ordered[int(len(ordered) * 0.9) - 1] * 1000,
            "patch_p50_ms": statistics.median(patch_answer) * 1000, "cpu_ms": cpu}


def run(workdir: Path, binds: int, keep_alive: bool = True) -> dict:
    """An idle all-in-one of its own (API, conductor, agent, a recording Nova), warmed up
    with a tenth of the binds, then ``binds`` binds measured one at a time."""
    nova = RecordingNova(keep_alive=keep_alive).start()
    stack = AcceldStack(workdir, free_port(), free_port(), free_port(), extra_config=(
        f"\n[nova]\nauth_type = none\nendpoint_override = {nova.url}\n"))
    stack.configure()
    try:
        stack.start_backend()
        stack.start_api()
        rp_uuid = stack.wait_for_device()["rp_uuid"]
        measure(stack, nova, rp_uuid, max(10, binds // 10))  # warm up
        return measure(stack, nova, rp_uuid, binds)
    finally:
        stack.stop()
        nova.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binds", type=int, default=200)
    parser.add_argument("--workdir")
    parser.add_argument("--new-connections", action="store_true",
                        help="Nova answers HTTP/1.0: each event on a connection of its own "
                        "(how this benchmark measured until issue 26)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="acceld-bind-latency-"))
    result = run(workdir, args.binds, keep_alive=not args.new_connections)
    print(f"PATCH to Nova's bound event, {result['binds']} binds one at a time: median "
          f"{result['p50_ms']:.1f} ms, p10 {result['p10_ms']:.1f} ms, p90 "
          f"{result['p90_ms']:.1f} ms (PATCH answered in {result['patch_p50_ms']:.1f} ms "
          f"median); load average {os.getloadavg()[0]:.2f}")
    print("CPU per bind (POST, PATCH, GET, DELETE): " + ", ".join(
        f"{name} {ms:.2f} ms" for name, ms in result["cpu_ms"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
