"""`make bench-scale`: two conductors and two API processes on PostgreSQL, many simulated nodes.

What issue 15 asks of a large cloud, measured end to end on one machine:

1. **reconcile from empty**: a fresh database, ``acceld simulate`` agents spread over the
   two conductors; the time until every agent's first hello was answered (each node is
   pulled and reconciled inside that hello) and the devices in the database;
2. **steady state**: heartbeats only; the conductors' CPU (both, from /proc) per hello;
3. **churn**: 1% of all devices change every 10 s;
4. **kill -9 of one conductor** under a stream of binds: the time until the survivor's
   ring drops it (its hosts' periodic work is owned again: the survivor logs the ring
   change) and until every agent has had a hello answered after the kill (agents of the
   dead conductor fail over to the other at their next heartbeat);
5. **binds throughout**: from registration to the end, one ARQ at a time per API process
   is created and bound (collection PATCH, alternating API processes) to a free FPGA of
   a simulated node; at the end every one must be ``Bound`` to its own handle and Nova
   (a recording endpoint) must have had exactly one event for it.

    .venv/bin/python -m bench.scale_ha [--agents 2000] [--devices-per-agent 8]
        [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--write-doc]

The database is created for the run (``acceld_scale_<pid>``) and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import requests
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, deployables, devices
from acceld.runtime.secrets import ensure_secret_file
from bench.acceld_stack import ACCELD
from bench.procstat import cpu_seconds, tree_cpu_seconds
from bench.upstream import HEADERS, stop_process, tail
from tests.support.net import free_port
from tests.support.nova import RecordingNova

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- bench-scale:begin -->", "<!-- bench-scale:end -->"
HEARTBEAT = 10.0
DP = "scale-fpga"


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _cpu(pid: int) -> float:
    """A conductor's or the simulator's CPU so far; 0 once it is gone (the killed one)."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def _events_per_arq(nova: RecordingNova) -> Counter:
    """How many Nova events each ARQ (the event's tag) got."""
    return Counter(event.get("tag", "") for event in nova.events())


# ---- binds submitted throughout ----------------------------------------------------------------

class Binder:
    """One ARQ at a time per API process: create, bind to a free FPGA, wait for it to
    resolve; every ARQ, its instance and how long it took are kept for the checks."""

    def __init__(self, api_urls: list[str], targets: list[tuple[str, str]]) -> None:
        self.api_urls = api_urls
        self.targets = targets  # (hostname, rp_uuid) of free FPGA deployables
        self.lock = threading.Lock()
        self.submitted: list[dict] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,), daemon=True)
                         for url in api_urls]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _next_target(self) -> tuple[str, str] | None:
        with self.lock:
            return self.targets.pop() if self.targets else None

    def _run(self, url: str) -> None:
        session = requests.Session()
        session.headers.update(HEADERS)
        while not self._stop.is_set():
            target = self._next_target()
            if target is None:
                return
            try:
                self._one(session, url, target)
            except (requests.RequestException, RuntimeError, ValueError, KeyError) as exc:
                with self.lock:
                    self.errors.append(f"{url}: {exc.__class__.__name__}: {exc}"[:300])
                time.sleep(0.5)
            self._stop.wait(0.2)

    def _one(self, session: requests.Session, url: str, target: tuple[str, str]) -> None:
        resp = session.post(f"{url}/accelerator_requests", json={"device_profile_name": DP},
                            timeout=30)
        if resp.status_code != 201:
            raise RuntimeError(f"create: {resp.status_code} {resp.text[:200]}")
        arq = resp.json()["arqs"][0]["uuid"]
        instance = str(uuid.uuid4())
        record = {"arq": arq, "instance": instance, "api": url, "started": time.time(),
                  "resolved": None}
        patch = {arq: [{"path": "/hostname", "op": "add", "value": target[0]},
                       {"path": "/device_rp_uuid", "op": "add", "value": target[1]},
                       {"path": "/instance_uuid", "op": "add", "value": instance}]}
        resp = session.patch(f"{url}/accelerator_requests", json=patch, timeout=30)
        if resp.status_code != 202:
            raise RuntimeError(f"bind: {resp.status_code} {resp.text[:200]}")
        with self.lock:
            self.submitted.append(record)
        query = f"{url}/accelerator_requests?instance={instance}&bind_state=resolved"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = session.get(query, timeout=30)
            if got.status_code == 200:
                record["resolved"] = time.time()
                record["states"] = sorted({a["state"] for a in got.json()["arqs"]})
                return
            time.sleep(0.05)
        raise RuntimeError(f"ARQ {arq} did not resolve in 300 s")

    def finish(self) -> None:
        """Submit no more; the binds in flight go on (their agents must still be there)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=320)


# ---- the run -----------------------------------------------------------------------------------

class Cluster:
    def __init__(self, workdir: Path, db_url: str, nova_url: str) -> None:
        self.workdir = workdir
        self.db_url = db_url
        self.procs: dict[str, subprocess.Popen] = {}
        self.conductor_ports = [free_port(), free_port()]
        self.api_ports = [free_port(), free_port()]
        (workdir / "common.conf").write_text(
            f"[DEFAULT]\nstate_path = {workdir}\nhost = scale-controller\n"
            f"[database]\nconnection = {db_url}\n"
            f"[agent]\nheartbeat_interval = {int(HEARTBEAT)}\n"
            f"[placement]\ncheck_allocations = false\n"
            # A bind claimed by the killed conductor is taken over after its lease.
            f"[conductor]\nbind_lease_seconds = 10\n"
            f"[nova]\nauth_type = none\nendpoint_override = {nova_url}\n")
        for i in range(2):
            (workdir / f"conductor{i}.conf").write_text(
                f"[conductor]\nport = {self.conductor_ports[i]}\nname = conductor-{i}\n")
            (workdir / f"api{i}.conf").write_text(
                f"[api]\nport = {self.api_ports[i]}\nworkers = 1\n"
                # Both conductors, this API's own first; it fails over to the other.
                f"[conductor]\nurl = http://127.0.0.1:{self.conductor_ports[i]},"
                f"http://127.0.0.1:{self.conductor_ports[1 - i]}\n")
        ensure_secret_file(str(workdir))

    def argv(self, command: str, *confs: str) -> list[str]:
        """``command`` (words split on spaces) with the common config, then ``confs``."""
        files = ["--config-file", str(self.workdir / "common.conf")]
        for conf in confs:
            files += ["--config-file", str(self.workdir / conf)]
        return [*ACCELD, *command.split(), *files, "--state-path", str(self.workdir)]

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.workdir / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        out.close()
        self.procs[name] = proc
        return proc

    @property
    def conductor_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.conductor_ports]

    @property
    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}/accelerator/v2" for port in self.api_ports]

    def start(self) -> None:
        subprocess.run(self.argv("db upgrade"), check=True, capture_output=True,
                       timeout=300)
        for i in range(2):
            self.spawn(f"conductor{i}", self.argv("conductor", f"conductor{i}.conf"))
            self.spawn(f"api{i}", self.argv("api", f"api{i}.conf"))
        deadline = time.monotonic() + 120
        for url in [u.rsplit("/v2", 1)[0] + "/" for u in self.api_urls]:
            while True:
                self.check_alive()
                try:
                    if requests.get(url, timeout=5).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not answer within 120 s")
                time.sleep(0.2)
        for port in self.conductor_ports:
            _wait_port(port, deadline, self)

    def check_alive(self, skip: tuple[str, ...] = ()) -> None:
        for name, proc in self.procs.items():
            if name not in skip and name != "simulate" and proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}:\n"
                                   + tail(self.workdir / f"{name}.out"))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc)


def _wait_port(port: int, deadline: float, cluster: Cluster) -> None:
    import socket

    while True:
        cluster.check_alive()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} did not listen") from None
            time.sleep(0.1)


def _free_fpgas(db: Database) -> list[tuple[str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(devices.c.hostname, deployables.c.rp_uuid).select_from(
            deployables.join(devices, devices.c.id == deployables.c.device_id)).where(
            devices.c.type == "FPGA", deployables.c.rp_uuid.is_not(None))).all()
    targets = [(r[0], r[1]) for r in rows]
    random.Random(15).shuffle(targets)
    return targets


def _ring_drop_seen(log_file: Path, dead: str, since: int) -> bool:
    """The survivor logged a ring without ``dead`` (after byte ``since`` of its log)."""
    with open(log_file, "rb") as handle:
        handle.seek(since)
        return re.search(rb"Conductor ring of .*gone: [^;]*" + re.escape(dead.encode()),
                         handle.read()) is not None


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    admin = make_url(args.postgres_url)
    name = f"acceld_scale_{os.getpid()}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = admin.set(database=name).render_as_string(hide_password=False)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="acceld-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    nova = RecordingNova().start()
    cluster = Cluster(workdir, db_url, nova.url)
    db = Database(db_url)
    rows: list[tuple[str, str]] = []
    binder: Binder | None = None
    try:
        cluster.start()
        log(f"2 conductors, 2 API processes on PostgreSQL; {args.agents} simulated agents x "
            f"{args.devices_per_agent} devices (workdir {workdir})")
        resp = requests.post(f"{cluster.api_urls[0]}/device_profiles", headers=HEADERS,
                             timeout=60, json=[{"name": DP, "groups": [
                                 {"resources:FPGA": "1"}]}])
        if resp.status_code != 201:
            raise RuntimeError(f"profile: {resp.status_code} {resp.text}")
        _BASELINE["rate"] = _measure_idle(
            [cluster.procs["conductor0"].pid, cluster.procs["conductor1"].pid], args.baseline)
        log(f"conductors without agents: {_BASELINE['rate'] * 100:.1f}% of a core together")
        cluster.spawn("simulate", [
            *cluster.argv("simulate"), "--agents", str(args.agents),
            "--devices-per-agent", str(args.devices_per_agent),
            "--conductor-url", ",".join(cluster.conductor_urls),
            "--heartbeat-interval", str(HEARTBEAT), "--connections", str(args.connections),
            "--steady-seconds", str(args.steady), "--churn-seconds", str(args.churn),
            "--change-percent", "1", "--change-every", "10", "--hold-seconds", str(args.hold),
            "--status-every", "1", "--register-timeout", str(args.register_timeout)])
        rows += _follow(args, cluster, db, nova, workdir)
        binder = cluster.binder  # type: ignore[attr-defined]
    finally:
        if binder is not None:
            binder.stop()
        cluster.stop()
        nova.stop()
        db.dispose()
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()
    return rows


def _events(path: Path, offset: int) -> tuple[list[dict], int]:
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    cut = data.rfind(b"\n") + 1
    events = []
    for line in data[:cut].splitlines():
        if line.startswith(b"{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events, offset + cut


def _follow(args: argparse.Namespace, cluster: Cluster, db: Database, nova: RecordingNova,
            workdir: Path) -> list[tuple[str, str]]:
    """Read the simulator's phase lines; sample, bind and kill at the right moments."""
    sim_out = workdir / "simulate.out"
    offset = 0
    conductors = [cluster.procs["conductor0"].pid, cluster.procs["conductor1"].pid]
    apis = [cluster.procs["api0"].pid, cluster.procs["api1"].pid]
    simulator = cluster.procs["simulate"].pid
    # Per phase line: (monotonic, conductors' CPU, API processes' CPU, the simulator's CPU:
    # is the simulator, on the same cores, what limits the conductors?). PostgreSQL's own is
    # not sampled: the backends of a pool's overflow connections exit with their CPU, and
    # the server is shared with whatever else runs on the machine.
    samples: dict[str, tuple[float, list[float], list[float], float]] = {}
    seen: dict[str, dict] = {}
    rows: list[tuple[str, str]] = []
    cluster.binder = None  # type: ignore[attr-defined]
    killed_at: float | None = None
    hold_started: float | None = None
    ring_moved: float | None = None
    agents_moved: float | None = None
    survivor_log = workdir / "conductor1.out"
    survivor_offset = 0
    deadline = time.monotonic() + args.register_timeout + args.steady + args.churn \
        + args.hold + 300
    while "summary" not in seen and "failed" not in seen:
        if time.monotonic() > deadline:
            raise RuntimeError("the simulator did not finish:\n" + tail(sim_out))
        cluster.check_alive(skip=("conductor0",) if killed_at else ())
        if cluster.procs["simulate"].poll() is not None and "summary" not in seen:
            events, offset = _events(sim_out, offset)
            for event in events:
                seen[event["event"]] = event
            if "summary" not in seen:
                raise RuntimeError("the simulator exited:\n" + tail(sim_out))
        events, offset = _events(sim_out, offset)
        for event in events:
            kind = event["event"]
            if kind != "status":
                seen[kind] = event
                samples[kind] = (time.monotonic(), [_cpu(p) for p in conductors],
                                 [tree_cpu_seconds(p) for p in apis], _cpu(simulator))
                log(f"simulate: {json.dumps(event)[:300]}")
            if kind == "churn_start":  # binds from here to the end (steady: hellos only)
                cluster.binder = Binder(cluster.api_urls, _free_fpgas(db))  # type: ignore[attr-defined]
                cluster.binder.start()  # type: ignore[attr-defined]
            elif kind == "hold_start" and killed_at is None:
                hold_started = time.monotonic()
                time.sleep(args.kill_after)
                survivor_offset = survivor_log.stat().st_size
                os.kill(conductors[0], signal.SIGKILL)
                cluster.procs["conductor0"].wait(timeout=10)
                killed_at = time.time()
                log("kill -9 conductor-0")
            elif kind == "status" and killed_at is not None and agents_moved is None:
                if event["oldest_ok"] > killed_at:
                    agents_moved = event["time"] - killed_at
        binder = cluster.binder  # type: ignore[attr-defined]
        if hold_started is not None and binder is not None and \
                time.monotonic() > hold_started + args.hold - _BIND_MARGIN:
            binder.finish()  # the last binds resolve while the agents still heartbeat
        if killed_at is not None and ring_moved is None and \
                _ring_drop_seen(survivor_log, "conductor-0", survivor_offset):
            ring_moved = time.time() - killed_at
        time.sleep(0.2)
    if "failed" in seen:
        rows.append(("reconcile from empty", f"FAILED: {json.dumps(seen['failed'])[:400]}"))
        return rows

    with db.read() as conn:
        n_devices = conn.execute(select(func.count()).select_from(devices)).scalar_one()
    reg = seen["registered"]
    cpu_reg = sum(samples["registered"][1]) - sum(samples["listening"][1])
    sim_reg = samples["registered"][3] - samples["listening"][3]
    goal = "met" if reg["seconds"] <= 60 else f"missed by {reg['seconds'] - 60:.0f} s"
    rows.append((f"reconcile {args.agents:,} nodes x {args.devices_per_agent} devices from "
                 "empty (goal <= 60 s)",
                 f"{reg['seconds']:.1f} s ({goal}); {n_devices:,} devices in the database; "
                 f"conductors' CPU {cpu_reg:.1f} s, {cpu_reg / args.agents * 1000:.1f} ms a "
                 f"node; the simulator's {sim_reg:.1f} s"))
    for phase, label in (("steady", "steady state, heartbeats only"),
                         ("churn", "1% of the devices changing every 10 s")):
        if f"{phase}_end" not in seen:
            continue
        (t0, c0, a0, s0), (t1, c1, a1, s1) = samples[f"{phase}_start"], samples[f"{phase}_end"]
        ev = seen[f"{phase}_end"]
        cpu = sum(c1) - sum(c0)
        base = _BASELINE.get("rate", 0.0) * (t1 - t0)  # periodic tasks, no agents
        per_hello = (cpu - base) / ev["hellos"] * 1000 if ev["hellos"] else float("nan")
        extra = (f"{ev['devices_changed']} devices changed, {ev['pulls']} pulls; "
                 if phase == "churn" else "")
        goal = ""
        if phase == "steady":
            goal = " (goal <= 0.3 ms: " + ("met)" if per_hello <= 0.3 else "missed)")
        rows.append((label, (
            f"{extra}{ev['hellos']:,} hellos in {t1 - t0:.0f} s; conductors' CPU "
            f"{cpu:.1f} s, {base:.1f} s of it their work without agents: {per_hello:.3f} ms "
            f"per hello{goal}; "
            f"{cpu / (t1 - t0) * 100:.0f}% of a core for both; API processes' CPU "
            f"{sum(a1) - sum(a0):.1f} s (binds); the simulator's CPU {s1 - s0:.1f} s")))
    if killed_at is not None:
        moved = (f"{ring_moved:.1f} s until the survivor's ring dropped it (its hosts' "
                 "periodic work owned again)" if ring_moved is not None
                 else "the survivor's ring never dropped it during the hold")
        agents = (f"{agents_moved:.1f} s until every agent had a hello answered after the kill"
                  if agents_moved is not None else
                  "not every agent had a hello answered during the hold")
        goal_met = (ring_moved is not None and agents_moved is not None
                    and max(ring_moved, agents_moved) <= 30)
        rows.append(("kill -9 of one conductor (goal <= 30 s)",
                     f"{moved}; {agents} ({'met' if goal_met else 'missed'}); "
                     f"{seen['hold_end'].get('failovers', 0):,} failovers"))
    binder = cluster.binder  # type: ignore[attr-defined]
    if binder is not None:
        binder.stop()
        rows.append(("binds submitted throughout", _check_binds(binder, db, nova)))
    return rows


_BASELINE: dict[str, float] = {}
# Seconds before the simulator's agents stop (end of the hold phase) that no more binds
# are submitted: one in flight when they stop would wait for its agent until bind_timeout.
_BIND_MARGIN = 15.0  # the conductors' CPU rate without agents (run)


def _measure_idle(conductors: list[int], seconds: float) -> float:
    """CPU seconds per second both conductors spend with no agent at all (their periodic
    tasks: membership, sweeps, scans), subtracted from the phases' CPU per hello."""
    before = sum(_cpu(p) for p in conductors)
    time.sleep(seconds)
    return (sum(_cpu(p) for p in conductors) - before) / seconds


def _check_binds(binder: Binder, db: Database, nova: RecordingNova) -> str:
    records = list(binder.submitted)
    uuids = [r["arq"] for r in records]
    deadline = time.monotonic() + 30  # the last events are sent after the ARQ resolved
    while time.monotonic() < deadline:
        per_arq = _events_per_arq(nova)
        if all(per_arq[u] >= 1 for u in uuids):
            break
        time.sleep(0.2)
    with db.read() as conn:
        rows = conn.execute(select(accelerator_requests.c.uuid, accelerator_requests.c.state,
                                   accelerator_requests.c.attach_handle_id).where(
            accelerator_requests.c.uuid.in_(uuids))).all() if uuids else []
    states: dict[str, int] = {}
    for row in rows:
        states[row.state] = states.get(row.state, 0) + 1
    handles = [r.attach_handle_id for r in rows if r.attach_handle_id is not None]
    per_arq = _events_per_arq(nova)
    counts = [per_arq[u] for u in uuids]
    lost = sum(1 for c in counts if c == 0)
    doubled = sum(1 for c in counts if c > 1)
    took = sorted(r["resolved"] - r["started"] for r in records if r["resolved"])
    slowest = f"{took[-1]:.1f} s" if took else "n/a"
    p50 = f"{took[len(took) // 2] * 1000:.0f} ms" if took else "n/a"
    verdict = ("none lost or doubled" if lost == 0 and doubled == 0
               and len(set(handles)) == len(handles) and states.get("Bound") == len(uuids)
               else "PROBLEM")
    return (f"{len(uuids)} binds: states {states}; Nova events: {lost} ARQs without, "
            f"{doubled} with more than one; {len(handles) - len(set(handles))} handles held "
            f"twice; {verdict}; submit to resolved p50 {p50}, slowest {slowest}; "
            f"{len(binder.errors)} client errors"
            + (f" (first: {binder.errors[0]})" if binder.errors else ""))


def write_doc(rows: list[tuple[str, str]], command: str) -> None:
    body = "\n".join([
        BEGIN, "### Latest scale run", "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, reproduce with `{command}`.",
        "", "| scale (2 conductors, 2 API processes, PostgreSQL) | result |", "|---|---|",
        *[f"| {label} | {value} |" for label, value in rows], END])
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + body + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + body + "\n"
    DOC.write_text(doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--devices-per-agent", type=int, default=8)
    parser.add_argument("--postgres-url", default=os.environ.get(
        "ACCELD_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--connections", type=int, default=8,
                        help="Kept-alive connections per conductor the simulated agents "
                             "share (default 8; 32 measured slower at 10,000 nodes).")
    parser.add_argument("--steady", type=float, default=30.0)
    parser.add_argument("--churn", type=float, default=30.0)
    parser.add_argument("--hold", type=float, default=45.0)
    parser.add_argument("--kill-after", type=float, default=3.0,
                        help="Seconds into the hold phase at which conductor-0 is killed.")
    parser.add_argument("--baseline", type=float, default=10.0,
                        help="Seconds the conductors' CPU is measured before any agent.")
    parser.add_argument("--register-timeout", type=float, default=600.0)
    parser.add_argument("--workdir")
    parser.add_argument("--write-doc", action="store_true",
                        help="Write the table into docs/performance.md.")
    args = parser.parse_args(argv)
    rows = run(args)
    width = max(len(label) for label, _ in rows) if rows else 0
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    if args.write_doc:
        write_doc(rows, f".venv/bin/python -m bench.scale_ha --agents {args.agents} "
                        f"--devices-per-agent {args.devices_per_agent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
