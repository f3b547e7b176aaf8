"""The scale part of `make bench`: a real `acceld conductor` and `acceld simulate` agents.

From an empty SQLite database: the time until every simulated agent's first
hello has been answered, which includes the conductor pulling its hardware and
reconciling it; then a steady state of heartbeats only; then churn, 1% of the
devices changing every 10 s. Between the simulator's phase lines the conductor
process is sampled: CPU seconds (/proc/<pid>/stat), write system calls and
bytes (/proc/<pid>/io), and the inventory rows written in the phase (rows of
devices, deployables, attributes and attach handles whose created_at or
updated_at falls inside it).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

from sqlalchemy import func, select

from acceld.db.engine import Database
from acceld.db.models import attach_handles, attributes, deployables, devices, utcnow
from acceld.runtime.secrets import ensure_secret_file
from bench.acceld_stack import ACCELD
from bench.procstat import cpu_seconds
from bench.upstream import stop_process, tail
from tests.support.net import free_port

HEARTBEAT = 10.0
STEADY_SECONDS = 30.0
CHURN_SECONDS = 30.0


def _io(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/io") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            out[key] = int(value)
    return out


def _rows_written(db: Database, since, until) -> int:  # type: ignore[no-untyped-def]
    """Inventory rows created or updated in [since, until): what the phase wrote."""
    total = 0
    with db.read() as conn:
        for table in (devices, deployables, attributes, attach_handles):
            total += conn.execute(select(func.count()).select_from(table).where(
                ((table.c.created_at >= since) & (table.c.created_at < until))
                | ((table.c.updated_at >= since) & (table.c.updated_at < until)))).scalar_one()
    return total


class Sample:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.at = time.monotonic()
        self.cpu = cpu_seconds(pid)
        io = _io(pid)
        self.syscw = io.get("syscw", 0)
        self.wbytes = io.get("write_bytes", 0)
        self.db_time = utcnow()

    def delta(self, later: "Sample") -> tuple[float, float, int, int]:
        return (later.at - self.at, later.cpu - self.cpu, later.syscw - self.syscw,
                later.wbytes - self.wbytes)


def run_scale(workdir: Path, agents: int, per_agent: int,
              log: Callable[[str], None]) -> list[tuple[str, str]]:
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "scale.conf"
    port = free_port()
    db_url = f"sqlite:///{workdir / 'acceld.sqlite'}"
    conf.write_text(f"[DEFAULT]\nstate_path = {workdir}\n[database]\nconnection = {db_url}\n"
                    f"[conductor]\nport = {port}\n[agent]\nheartbeat_interval = "
                    f"{int(HEARTBEAT)}\n")
    common = ["--config-file", str(conf), "--state-path", str(workdir)]
    ensure_secret_file(str(workdir))
    subprocess.run([*ACCELD, "db", "upgrade", *common], check=True, capture_output=True)
    log_file = open(workdir / "conductor.out", "ab")
    conductor = subprocess.Popen([*ACCELD, "conductor", *common], stdout=log_file,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    log_file.close()
    db = Database(db_url)
    rows: list[tuple[str, str]] = []
    sim = None
    try:
        _wait_port(port, conductor, workdir)
        log(f"scale: {agents} simulated agents x {per_agent} devices against a fresh conductor")
        sim = subprocess.Popen(
            [*ACCELD, "simulate", *common, "--agents", str(agents), "--devices-per-agent",
             str(per_agent), "--heartbeat-interval", str(HEARTBEAT), "--steady-seconds",
             str(STEADY_SECONDS), "--churn-seconds", str(CHURN_SECONDS), "--change-percent", "1",
             "--change-every", "10"],
            stdout=subprocess.PIPE, stderr=open(workdir / "simulate.err", "wb"), text=True,
            start_new_session=True)
        samples: dict[str, Sample] = {"start": Sample(conductor.pid)}
        events: dict[str, dict] = {}
        for line in sim.stdout:  # type: ignore[union-attr]
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events[event["event"]] = event
            samples[event["event"]] = Sample(conductor.pid)
            log(f"scale: {line.strip()}")
            if event["event"] == "failed":
                break
        sim.wait(timeout=60)
        if "registered" not in events:
            rows.append(("reconcile from empty", "FAILED: " + json.dumps(events.get("failed")) +
                         "\n" + tail(workdir / "simulate.err", 800)))
            return rows
        reg = events["registered"]
        _, cpu, syscw, wbytes = samples["listening"].delta(samples["registered"])
        with db.read() as conn:
            n_devices = conn.execute(select(func.count()).select_from(devices)).scalar_one()
        rows.append((f"reconcile {agents} agents x {per_agent} devices from empty",
                     f"{reg['seconds']:.1f} s until every agent was pulled and reconciled "
                     f"({n_devices} devices in the DB; conductor CPU {cpu:.1f} s)"))
        for phase, label in (("steady", "steady state, heartbeats only"),
                             ("churn", "1% of the devices changing every 10 s")):
            if f"{phase}_end" not in events:
                continue
            start, end = samples[f"{phase}_start"], samples[f"{phase}_end"]
            seconds, cpu, syscw, wbytes = start.delta(end)
            ev = events[f"{phase}_end"]
            written = _rows_written(db, start.db_time, end.db_time)
            per_min = 60.0 / seconds
            changed = (f"{ev['devices_changed']} devices changed, " if phase == "churn"
                       else "")
            rows.append((label, (
                f"over {seconds:.0f} s: {changed}{ev['hellos']:,} hellos, {ev['pulls']:,} "
                f"pulls, {written:,} inventory rows written. Per minute: conductor CPU "
                f"{cpu * per_min:.1f} s, {syscw * per_min:,.0f} write syscalls, "
                f"{wbytes * per_min / 1e6:.1f} MB written to disk")))
        return rows
    finally:
        if sim is not None and sim.poll() is None:
            stop_process(sim)
        stop_process(conductor)
        db.dispose()


def _wait_port(port: int, proc: subprocess.Popen, workdir: Path) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("conductor exited:\n" + tail(workdir / "conductor.out"))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("conductor did not listen within 60 s")
