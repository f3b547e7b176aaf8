"""`make bench`: acceld against upstream Cyborg 17.0.0, back to back, same machine and workloads.

Both run one API worker process over SQLite, with their conductor and agent (fake
driver) beside them; upstream also needs RabbitMQ (127.0.0.1:5672) and a real
Placement. Each request workload is driven by wrk (bench/wrk.py: 4 kept-alive
connections, a C client that never competes with the server for the two cores); a side
that takes seconds per answer, and Nova's lifecycle (a sequence), by the Python load
generator (bench/loadgen.py: concurrency 4, bounded by count and time). The table gives
req/s, p50, the ratio acceld/upstream, and each goal of issue 26 with its margin; then
the bind latency on an idle all-in-one (bench/bind_latency.py) and the all-in-one's
start. Results also go to docs/performance.md (between the bench markers; the notes
around them stay).

    .venv/bin/python -m bench.run [--skip-upstream] [--skip-simulate] [--skip-bind]
        [--binds 200] [--agents 1000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench import loadgen, wrk
from bench.acceld_stack import ACCELD, AcceldStack
from bench.upstream import HEADERS, HOSTNAME, UpstreamCyborg, ensure_venv, stop_process
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
LIFE_DP = "bench-life"
V2 = "/accelerator/v2"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- workloads ---------------------------------------------------------------------------------

@dataclass
class Target:
    """What the binding device is for the lifecycle: the fake driver's deployable."""

    hostname: str
    rp_uuid: str


def op_version(c: loadgen.Client, i: int, n: int) -> None:
    c.expect(200, "GET", "/accelerator/")


def op_profile_list(c: loadgen.Client, i: int, n: int) -> None:
    body = c.expect(200, "GET", f"{V2}/device_profiles").json()
    if len(body["device_profiles"]) < 100:
        raise loadgen.HttpError(f"expected 100 profiles, got {len(body['device_profiles'])}")


def op_profile_create(c: loadgen.Client, i: int, n: int) -> None:
    c.expect(201, "POST", f"{V2}/device_profiles",
             [{"name": f"bench-c-{loadgen.unique_suffix(i, n)}",
               "groups": [{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]}])


def op_arq_create(c: loadgen.Client, i: int, n: int) -> None:
    c.expect(201, "POST", f"{V2}/accelerator_requests", {"device_profile_name": LIFE_DP})


def op_arq_list(c: loadgen.Client, i: int, n: int) -> None:
    body = c.expect(200, "GET", f"{V2}/accelerator_requests").json()
    if len(body["arqs"]) < 1000:
        raise loadgen.HttpError(f"expected 1000 ARQs, got {len(body['arqs'])}")


def op_device_list(c: loadgen.Client, i: int, n: int) -> None:
    body = c.expect(200, "GET", f"{V2}/devices").json()
    if len(body["devices"]) < 10000:
        raise loadgen.HttpError(f"expected 10000 devices, got {len(body['devices'])}")


def make_lifecycle(target: Target):  # type: ignore[no-untyped-def]
    """Nova's sequence for one instance: create, bind (collection PATCH), poll resolved, delete."""

    def op(c: loadgen.Client, i: int, n: int) -> None:
        arqs = c.expect(201, "POST", f"{V2}/accelerator_requests",
                        {"device_profile_name": LIFE_DP}).json()["arqs"]
        instance = str(uuid.uuid4())
        patch = {a["uuid"]: [{"path": "/hostname", "op": "add", "value": target.hostname},
                             {"path": "/device_rp_uuid", "op": "add", "value": target.rp_uuid},
                             {"path": "/instance_uuid", "op": "add", "value": instance}]
                 for a in arqs}
        c.expect(202, "PATCH", f"{V2}/accelerator_requests", patch)
        deadline = time.monotonic() + 60
        query = f"{V2}/accelerator_requests?instance={instance}&bind_state=resolved"
        while True:
            resp = c.request("GET", query)
            if resp.status == 200:
                states = {a["state"] for a in resp.json()["arqs"]}
                if states != {"Bound"}:
                    raise loadgen.HttpError(f"bind resolved as {states}")
                break
            if resp.status != 423 or time.monotonic() > deadline:
                raise loadgen.HttpError(f"resolved poll: {resp.status} {resp.body[:200]!r}")
            time.sleep(0.02)
        c.expect(204, "DELETE", f"{V2}/accelerator_requests?instance={instance}")

    return op


@dataclass
class Workload:
    key: str
    label: str
    op: object
    max_ops: int
    max_seconds: float
    target_ratio: float | None = None
    timeout: float = 60.0
    # The same request for wrk (bench/wrk.py): method, path below the server's root, body.
    wrk: tuple[str, str, str | None] | None = None


PROFILE_BODY = ('[{"name": "bench-c-{unique}", "groups": [{"resources:FPGA": "1", '
                '"trait:CUSTOM_FAKE_DEVICE": "required"}]}]')
# A side whose single answer takes longer than this is driven by bench/loadgen.py instead
# of wrk: wrk counts only the requests that finish within its run, which undercounts a
# server that takes seconds per answer, and the Python client's cost is nothing beside it.
WRK_SLOWEST_ANSWER = 0.5


def workloads(target: Target, devices: bool) -> list[Workload]:
    items = [
        Workload("version", "GET /accelerator/ (version document)", op_version, 3000, 5,
                 wrk=("GET", "/accelerator/", None)),
        Workload("dp_list", "GET device_profiles (100 profiles)", op_profile_list, 2000, 5, 20,
                 wrk=("GET", f"{V2}/device_profiles", None)),
        Workload("dp_create", "POST device_profiles", op_profile_create, 1500, 5, 20,
                 wrk=("POST", f"{V2}/device_profiles", PROFILE_BODY)),
        Workload("arq_list", "GET accelerator_requests (1,000 ARQs)", op_arq_list, 400, 6, 150,
                 wrk=("GET", f"{V2}/accelerator_requests", None)),
        Workload("arq_create", "POST accelerator_requests (1 ARQ)", op_arq_create, 1500, 5, 20,
                 wrk=("POST", f"{V2}/accelerator_requests",
                      f'{{"device_profile_name": "{LIFE_DP}"}}')),
        Workload("lifecycle", "ARQ lifecycle: create, bind, resolved, delete",
                 make_lifecycle(target), 400, 8, 30),
    ]
    if devices:
        # Upstream takes tens of seconds per request here: one request per client, 3 minutes.
        items.append(Workload("device_list", "GET devices (10,000 devices)", op_device_list,
                              20, 4, timeout=180))
    return items


def answer_seconds(base: str, w: Workload) -> float:
    """One request's time, unloaded (it also checks the request is answered)."""
    assert w.wrk is not None
    method, path, body = w.wrk
    started = time.monotonic()
    resp = requests.request(method, base + path, headers={**HEADERS, **(
        {"Content-Type": "application/json"} if body else {})}, timeout=w.timeout,
        data=body.replace("{unique}", f"probe-{uuid.uuid4().hex[:8]}") if body else None)
    if resp.status_code >= 300:
        raise RuntimeError(f"{w.key} at {base}: {resp.status_code} {resp.text[:300]}")
    return time.monotonic() - started


def drive(base: str, w: Workload, op: object) -> object:
    """wrk where the side answers quickly; bench/loadgen.py where it takes seconds."""
    if w.wrk is not None and wrk.available() and answer_seconds(base, w) <= WRK_SLOWEST_ANSWER:
        method, path, body = w.wrk
        return wrk.run(w.key, base + path, headers=HEADERS, method=method, body=body,
                       connections=4, seconds=w.max_seconds, timeout=w.timeout)
    if w.wrk is not None and not wrk.available():
        log("wrk is not installed (apt-get install wrk): the Python load generator runs, "
            "and its own CPU competes with the server's")
    return loadgen.run(w.key, base, op, headers=HEADERS, concurrency=4,  # type: ignore[arg-type]
                       max_ops=w.max_ops, max_seconds=w.max_seconds, timeout=w.timeout)


# ---- process measurements ----------------------------------------------------------------------

def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def api_memory(master: int) -> tuple[float, float]:
    """(worker RSS, master + worker RSS) in MB for a gunicorn master with one worker."""
    workers = children(master)
    worker = sum(rss_mb(p) for p in workers)
    return worker, worker + rss_mb(master)


# ---- the two stacks, run workload by workload ----------------------------------------------

@dataclass
class SideResult:
    name: str
    start_to_200: float = float("nan")
    rss_start: tuple[float, float] = (0.0, 0.0)
    rss_after: tuple[float, float] = (0.0, 0.0)
    results: dict[str, loadgen.Result] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Side:
    """One running stack (upstream or acceld) and what was measured on it."""

    result: SideResult
    stack: object  # UpstreamCyborg | AcceldStack: same seeding and process interface
    target: Target | None = None

    @property
    def base(self) -> str:
        return self.stack.root.rsplit("/accelerator", 1)[0]  # type: ignore[attr-defined]


def start_upstream(workdir: Path, placement_url: str, nova_url: str) -> Side:
    ensure_venv(log)
    cyborg = UpstreamCyborg(workdir, free_port(), placement_url, nova_url)
    side = Side(SideResult("upstream"), cyborg)
    cyborg.configure()
    cyborg.start_backend()
    side.result.start_to_200 = cyborg.start_api()
    log(f"upstream: API answered 200 after {side.result.start_to_200:.2f} s")
    side.target = Target(HOSTNAME, cyborg.wait_for_device()["rp_uuid"])
    return side


def start_acceld(workdir: Path) -> Side:
    stack = AcceldStack(workdir, free_port(), free_port(), free_port())
    side = Side(SideResult("acceld"), stack)
    stack.configure()
    has_agent = stack.start_backend()
    side.result.start_to_200 = stack.start_api()
    log(f"acceld: API answered 200 after {side.result.start_to_200:.2f} s")
    if has_agent:
        side.target = Target(HOSTNAME, stack.wait_for_device()["rp_uuid"])
    else:
        side.result.notes.append("this build has no `acceld agent`: the fake FPGA (16 handles) "
                                 "was inserted through the DB layer instead of reported")
        side.target = Target(HOSTNAME, _insert_fake_fpga(stack))
    return side


def prepare(side: Side) -> None:
    """The lifecycle's profile through the API, then the list data straight into the DB."""
    resp = requests.post(f"{side.stack.url}/device_profiles", headers=HEADERS, timeout=60,
                         json=[{"name": LIFE_DP, "groups": [
                             {"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]}])
    if resp.status_code != 201:
        raise RuntimeError(f"{side.result.name}: creating {LIFE_DP}: {resp.status_code} "
                           f"{resp.text}")
    side.stack.seed_profiles(99, "bench-l")  # 100 with the lifecycle's
    side.stack.seed_arqs(1000, LIFE_DP)
    side.result.rss_start = api_memory(side.stack.procs["api"].pid)


def run_workloads(sides: list[Side]) -> None:
    """Each workload on every side in turn, so that both see the same machine load."""
    for w in workloads(Target("", ""), devices=True):
        for side in sides:
            if w.key == "lifecycle":
                # Nova's polls list by instance: start from no ARQs, as a fresh cloud would.
                side.stack.delete_arqs()
            if w.key == "device_list":
                side.stack.seed_devices(10000)
            op = make_lifecycle(side.target) if w.key == "lifecycle" else w.op
            log(f"{side.result.name}: {w.label}")
            result = drive(side.base, w, op)
            side.result.results[w.key] = result
            tool = "wrk" if isinstance(result, wrk.Result) else "loadgen"
            log(f"{side.result.name}: {w.key} ({tool}): {result.rate:.2f} ops/s, p50 "
                f"{result.p50_ms:.1f} ms, {result.ops} ok, {result.errors} errors "
                f"{result.first_error}")
    for side in sides:
        side.result.rss_after = api_memory(side.stack.procs["api"].pid)


def _insert_fake_fpga(stack: AcceldStack) -> str:
    sys.path.insert(0, str(REPO))
    from acceld.db.engine import Database
    from tests.support.inventory import add_fpga

    db = Database(stack.db_url)
    fpga = add_fpga(db, hostname=HOSTNAME, handles=16)
    db.dispose()
    return fpga["deployable"]["rp_uuid"]


def acceld_all_start(workdir: Path) -> float:
    """Seconds from `acceld all` starting to its API's first 200."""
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "all.conf"
    conf.write_text(f"[conductor]\nport = {free_port()}\n[agent]\nport = {free_port()}\n"
                    f"enabled_drivers = fake\n")
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([*ACCELD, "all", "--port", str(port), "--state-path", str(workdir),
                             "--config-file", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = started + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/accelerator/", timeout=1
                                ).status_code == 200:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"acceld all exited {proc.returncode}")
            time.sleep(0.02)
        raise RuntimeError("acceld all did not answer within 60 s")
    finally:
        stop_process(proc)


# ---- report ------------------------------------------------------------------------------------

def machine() -> str:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    free = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.rstrip()
    return (f"- CPU: {cpu}; `nproc` = {os.cpu_count()}\n- Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}\n- `free -h`:\n\n```\n{free}\n```")


def fmt_rate(r: loadgen.Result | None) -> str:
    if r is None:
        return "n/a"
    if r.ops == 0:
        return f"failed ({r.errors} errors)"
    return f"{r.rate:,.1f}" + (f" ({r.errors} err)" if r.errors else "")


def fmt_p50(r: loadgen.Result | None) -> str:
    return "n/a" if r is None or r.ops == 0 or math.isnan(r.p50_ms) else f"{r.p50_ms:,.1f} ms"


def at_least(value: float | None, goal: float) -> str:
    """'met (+12%)' or 'NO: missed by 30%' for a goal the value must reach."""
    if value is None or math.isnan(value):
        return "NO: not measured"
    margin = value / goal - 1
    return f"met (+{margin:.0%})" if margin >= 0 else f"NO: missed by {-margin:.0%}"


def at_most(value: float | None, goal: float) -> str:
    """The same for a goal the value must stay under (the margin is the room left)."""
    if value is None or math.isnan(value):
        return "NO: not measured"
    margin = 1 - value / goal
    return f"met ({margin:.0%} under)" if margin >= 0 else f"NO: over by {-margin:.0%}"


def table(up: SideResult | None, acc: SideResult, all_start: float | None,
          sim: list[tuple[str, str]] | None,
          bind: dict[str, float] | None = None) -> tuple[str, bool]:
    lines = ["| workload | upstream req/s | upstream p50 | acceld req/s | acceld p50 | "
             "ratio | goal | met, margin |", "|---|---|---|---|---|---|---|---|"]
    verdicts: list[str] = []
    for w in workloads(Target("", ""), True):
        a = acc.results.get(w.key)
        u = up.results.get(w.key) if up else None
        ratio = (a.rate / u.rate) if a and u and u.rate > 0 and a.ops else None
        met = ""
        if w.target_ratio is not None and up:
            met = at_least(ratio if a and not a.errors else None, w.target_ratio)
            verdicts.append(met)
        lines.append(f"| {w.label} | {fmt_rate(u)} | {fmt_p50(u)} | {fmt_rate(a)} | "
                     f"{fmt_p50(a)} | {f'{ratio:,.1f}x' if ratio else 'n/a'} | "
                     f"{f'>= {w.target_ratio:g}x' if w.target_ratio else ''} | {met} |")
    if up:
        worker_ratio = acc.rss_after[0] / up.rss_after[0] if up.rss_after[0] else float("nan")
        met = at_most(worker_ratio, 0.6)
        verdicts.append(met)
        lines.append(f"| API worker RSS after load (master + worker) | "
                     f"{up.rss_after[0]:.0f} MB ({up.rss_after[1]:.0f} MB) | | "
                     f"{acc.rss_after[0]:.0f} MB ({acc.rss_after[1]:.0f} MB) | | "
                     f"{worker_ratio:.2f} | <= 0.60 | {met} |")
        lines.append(f"| API worker RSS at start (master + worker) | "
                     f"{up.rss_start[0]:.0f} MB ({up.rss_start[1]:.0f} MB) | | "
                     f"{acc.rss_start[0]:.0f} MB ({acc.rss_start[1]:.0f} MB) | | | | |")
        lines.append(f"| API process start to first 200 | {up.start_to_200:.2f} s | | "
                     f"{acc.start_to_200:.2f} s | | | | |")
    else:
        lines.append(f"| API worker RSS after load (master + worker) | | | "
                     f"{acc.rss_after[0]:.0f} MB ({acc.rss_after[1]:.0f} MB) | | | | |")
        lines.append(f"| API process start to first 200 | | | {acc.start_to_200:.2f} s "
                     f"| | | | |")
    if bind is not None:
        met = at_most(bind["p50_ms"], 5.0)
        verdicts.append(met)
        lines.append(f"| bind, PATCH to Nova's event, idle all-in-one ({bind['binds']:.0f} "
                     f"binds; p90 {bind['p90_ms']:.1f} ms, PATCH answered "
                     f"{bind['patch_p50_ms']:.1f} ms) | | | | {bind['p50_ms']:.1f} ms | | "
                     f"<= 5 ms | {met} |")
    if all_start is not None:
        met = at_most(all_start, 3.0)
        verdicts.append(met)
        lines.append(f"| `acceld all` start to first 200 | | | {all_start:.2f} s | | | "
                     f"<= 3 s | {met} |")
    out = "\n".join(lines)
    if sim:
        out += "\n\n| scale simulation | result |\n|---|---|\n"
        out += "\n".join(f"| {k} | {v} |" for k, v in sim)
    notes = (acc.notes + (up.notes if up else []))
    if notes:
        out += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return out, not any(v.startswith("NO") for v in verdicts)


def write_doc(body: str, command: str) -> None:
    block = (f"{BEGIN}\n## Latest run\n\n{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"reproduce with `{command}`.\n\n{body}\n\nMachine:\n\n{machine()}\n{END}")
    if DOC.exists() and BEGIN in DOC.read_text():
        text = DOC.read_text()
        head, rest = text.split(BEGIN, 1)
        tail_text = rest.split(END, 1)[1] if END in rest else ""
        DOC.write_text(head + block + tail_text)
    else:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text("# Performance\n\n" + block + "\n")


# ---- main --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-upstream", action="store_true")
    parser.add_argument("--skip-simulate", action="store_true")
    parser.add_argument("--skip-acceld", action="store_true", help="Upstream only (debugging).")
    parser.add_argument("--skip-bind", action="store_true")
    parser.add_argument("--binds", type=int, default=200)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--devices-per-agent", type=int, default=8)
    parser.add_argument("--no-write", action="store_true", help="Do not update the doc.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="acceld-bench-"))
    log(f"work directory {workdir}")

    sides: list[Side] = []
    cleanup = []
    try:
        if not args.skip_upstream:
            sys.path.insert(0, str(REPO))
            from tests.compat.minimal_cloud import MinimalCloud
            from tests.support.placement import PlacementServer

            placement = PlacementServer(workdir / "placement")
            nova = MinimalCloud().start()
            cleanup += [placement.stop, nova.stop]
            log("starting Placement")
            placement.start()
            placement.create_compute_node(HOSTNAME)
            log("starting upstream Cyborg (RabbitMQ, conductor, agent, API)")
            side = start_upstream(workdir / "upstream", placement.url, nova.compute_url)
            cleanup.insert(0, side.stack.stop)
            sides.append(side)
        if not args.skip_acceld:
            side = start_acceld(workdir / "acceld")
            cleanup.insert(0, side.stack.stop)
            sides.append(side)
        for side in sides:
            prepare(side)
        run_workloads(sides)
    finally:
        for stop in cleanup:
            stop()
    by_name = {side.result.name: side.result for side in sides}
    up, acc = by_name.get("upstream"), by_name.get("acceld")
    if acc is None:
        for key, result in (up.results if up else {}).items():
            log(f"upstream {key}: {result.rate:.2f}/s p50 {result.p50_ms:.1f} ms")
        return 0
    log("timing `acceld all` start")
    all_start = acceld_all_start(workdir / "all")
    log(f"acceld all answered after {all_start:.2f} s")
    bind = None
    if not args.skip_bind:
        from bench import bind_latency

        log("bind latency on an idle all-in-one")
        bind = bind_latency.run(workdir / "bind", args.binds)
        log(f"bind: median {bind['p50_ms']:.1f} ms")
    sim = None
    if not args.skip_simulate:
        from bench.scale import run_scale

        sim = run_scale(workdir / "scale", args.agents, args.devices_per_agent, log)
    body, met = table(up, acc, all_start, sim, bind)
    print()
    print(body)
    print()
    print(f"goals {'all met' if met else 'NOT all met'}; {time.monotonic() - started:.0f} s")
    if not args.no_write:
        write_doc(body, "make bench")
        log(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
