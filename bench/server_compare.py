"""Which HTTP server serves acceld's public API fastest and safest: the serving-layer
comparison of issue 26, rerunnable.

    .venv/bin/python -m bench.server_compare [--seconds 6] [--rounds 2]
        [--candidate NAME ...] [--connections 4 ...] [--close] [--robustness]
        [--baseline-tree DIR]

Every candidate serves ``acceld.wsgi.api:application`` (or is `acceld api` itself) in one
worker process over its own copy of one SQLite database seeded with 100 device profiles
and 1,000 ARQs, noauth. The load is wrk (a C load generator, so the client is never the
limit: ``apt-get install wrk``), 2 threads, ``--connections`` kept-alive connections (as
keystoneauth clients keep them), or a connection per request with ``--close``. For each
workload the candidates run one after the other, their order reversed every round, so
all see the same machine. Reported per candidate and workload: the median req/s of the
rounds, its ratio to the first candidate, the median latency, and the server's CPU per
request (user + system of the server's processes, from /proc).

Candidates (``--candidate``, repeatable; default: acceld:1:1 acceld:1:2 acceld:1:4
gunicorn-sync uwsgi granian):

- ``acceld:W:T``: `acceld api` with ``[api] workers = W`` and ``threads = T``: its own
  connection loop (acceld/serving/connection_loop.py) in a gunicorn worker;
- ``gunicorn-sync``: gunicorn's synchronous worker (C parser), one process;
- ``uwsgi``: pyuwsgi (a test dependency), HTTP/1.1 socket (keep-alive), one process,
  one thread;
- ``granian``: granian 2.x, WSGI, one worker, one blocking thread, installed with
  ``pip install --target .bench/granian`` on first use (its maintainers' Rust server);
- ``baseline`` or ``baseline:W:T``: `acceld api` of another checkout (``--baseline-tree``),
  with its defaults or W workers of T threads.

``--robustness`` adds, per candidate: with 50 idle connections and 10 half-sent heads
open, does a new client still get the version document within 2 s; with 8 connections
that announced a body and send it slowly, the same. These are what disqualified
candidates in the original comparison (../shared/reference/server-bakeoff.md). Not part
of `make test`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench import wrk
from bench.procstat import tree_cpu_seconds
from bench.acceld_stack import AcceldStack
from bench.upstream import HEADERS
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[1]
GRANIAN_DIR = REPO / ".bench" / "granian"
GRANIAN_VERSION = "granian>=2.5,<3"
DEFAULT_CANDIDATES = ["acceld:1:1", "acceld:1:2", "acceld:1:4", "gunicorn-sync", "uwsgi",
                      "granian"]
V2 = "/accelerator/v2"
PROFILE = "bench-serve"

PROFILE_BODY = '[{"name": "srv-{unique}", "groups": [{"resources:FPGA": "1"}]}]'


@dataclass(frozen=True)
class Workload:
    name: str
    path: str
    body: str | None = None  # POSTed when set


WORKLOADS = [
    Workload("GET version document", "/accelerator/"),
    Workload("GET 100 device profiles", f"{V2}/device_profiles"),
    Workload("GET 1,000 ARQs", f"{V2}/accelerator_requests"),
    # Last: its creates lengthen the profile list.
    Workload("POST device profile", f"{V2}/device_profiles", body=PROFILE_BODY),
]


@dataclass
class Server:
    """One running candidate: its process group, URL and the processes whose CPU counts."""

    name: str
    proc: subprocess.Popen
    port: int
    workdir: Path
    results: dict[tuple[str, int], list["Sample"]] = field(default_factory=dict)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Sample:
    rate: float
    p50_ms: float
    cpu_us: float
    errors: int


def log(msg: str) -> None:
    print(f"[server_compare {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the database every candidate copies ---------------------------------------------------

def seed_template(workdir: Path) -> Path:
    """A migrated SQLite database with 100 profiles and 1,000 ARQs (acceld's own tables)."""
    stack = AcceldStack(workdir, free_port(), free_port(), free_port())
    stack.configure()
    stack.seed_profiles(99, "seed")
    stack.seed_profiles(1, PROFILE)
    stack.seed_arqs(1000, f"{PROFILE}-0")
    return workdir / "acceld.sqlite"


def candidate_dir(root: Path, name: str, template: Path) -> tuple[Path, Path]:
    """A state directory with its own copy of the database and a config file naming it."""
    workdir = root / re.sub(r"[^a-z0-9]+", "-", name)
    workdir.mkdir()
    database = workdir / "acceld.sqlite"
    shutil.copy(template, database)
    secret = template.parent / "secret"
    if secret.exists():
        shutil.copy(secret, workdir / "secret")
    conf = workdir / "acceld.conf"
    lines = ["[DEFAULT]", f"state_path = {workdir}", "[database]",
             f"connection = sqlite:///{database}", "[api]", "allow_insecure_noauth = true",
             "[placement]", "check_allocations = false"]
    conf.write_text("\n".join(lines) + "\n")
    return workdir, conf


# ---- candidates ----------------------------------------------------------------------------

def ensure_granian() -> bool:
    if (GRANIAN_DIR / "granian").is_dir():
        return True
    log(f"installing {GRANIAN_VERSION} into {GRANIAN_DIR}")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", "--target", str(GRANIAN_DIR),
                          GRANIAN_VERSION], capture_output=True, text=True)
    if out.returncode != 0:
        log(f"granian not installed, skipped: {out.stderr.strip()[-300:]}")
        return False
    return True


def command(name: str, conf: Path, port: int, baseline_tree: str | None
            ) -> tuple[list[str], dict[str, str], str | None] | None:
    """argv, extra environment and working directory of a candidate; None to skip it."""
    env = {"OS_ACCELD_CONFIG_FILES": str(conf)}
    app = "acceld.wsgi.api:application"
    python = sys.executable
    if name.startswith(("acceld:", "baseline:")) or name == "baseline":
        argv = [python, "-m", "acceld.cmd.main", "api", "--config-file", str(conf),
                "--port", str(port)]
        if ":" in name:
            _, workers, threads = name.split(":")
            with open(conf, "a") as handle:
                handle.write(f"[api]\nworkers = {workers}\nthreads = {threads}\n")
        return argv, env, baseline_tree if name.startswith("baseline") else None
    if name == "gunicorn-sync":
        return ([python, "-m", "gunicorn", "-w", "1", "-k", "sync", "--log-level", "warning",
                 "-b", f"127.0.0.1:{port}", app], env, None)
    if name == "uwsgi":
        uwsgi = Path(python).with_name("uwsgi")
        if not uwsgi.exists():
            log("uwsgi (pyuwsgi) not installed, skipped")
            return None
        return ([str(uwsgi), "--http11-socket", f"127.0.0.1:{port}", "--module", app,
                 "--master", "--processes", "1", "--threads", "1", "--need-app",
                 "--disable-logging", "--die-on-term", "--buffer-size", "16384"], env, None)
    if name == "granian":
        if not ensure_granian():
            return None
        env["PYTHONPATH"] = os.pathsep.join([str(GRANIAN_DIR), str(REPO)])
        return ([python, "-c", "from granian.cli import entrypoint; entrypoint()",
                 "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
                 "--workers", "1", "--blocking-threads", "1", "--runtime-threads", "1",
                 "--no-ws", app], env, None)
    raise SystemExit(f"unknown candidate {name!r}")


def start(name: str, root: Path, template: Path, baseline_tree: str | None) -> Server | None:
    workdir, conf = candidate_dir(root, name, template)
    port = free_port()
    spec = command(name, conf, port, baseline_tree)
    if spec is None:
        return None
    argv, env, cwd = spec
    out = open(workdir / "server.out", "ab")
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd or str(workdir),
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    server = Server(name, proc, port, workdir)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: "
                               + (workdir / "server.out").read_text()[-2000:])
        try:
            if requests.get(server.root + "/accelerator/", timeout=2).status_code == 200:
                # The first request of each route builds caches: not what is measured.
                for w in WORKLOADS[:3]:
                    requests.get(server.root + w.path, headers=HEADERS, timeout=30)
                return server
        except requests.RequestException:
            pass
        time.sleep(0.2)
    stop(server)
    raise RuntimeError(f"{name} did not answer within 60 s")


def stop(server: Server) -> None:
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
    except ProcessLookupError:
        pass


# ---- load ----------------------------------------------------------------------------------

def measure(server: Server, workload: Workload, connections: int, seconds: float,
            close: bool) -> Sample:
    before = tree_cpu_seconds(server.proc.pid)
    result = wrk.run(workload.name, server.root + workload.path, headers=HEADERS,
                     method="POST" if workload.body else "GET", body=workload.body,
                     connections=connections, seconds=seconds, timeout=10.0, close=close)
    spent = tree_cpu_seconds(server.proc.pid) - before
    return Sample(result.rate, result.p50_ms, spent / max(1, result.ops) * 1e6, result.errors)


# ---- robustness ----------------------------------------------------------------------------

def probe(server: Server, timeout: float = 2.0) -> str:
    started = time.monotonic()
    try:
        requests.get(server.root + "/accelerator/", timeout=timeout).raise_for_status()
    except requests.RequestException as exc:
        return f"no answer ({type(exc).__name__})"
    return f"answered in {(time.monotonic() - started) * 1000:.0f} ms"


def _connect(server: Server, first_bytes: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def _probe_while_open(server: Server, held: list[socket.socket]) -> str:
    """The probe's outcome while ``held`` stay open, then they are closed."""
    try:
        time.sleep(0.3)  # the server has seen them
        return probe(server)
    finally:
        for sock in held:
            sock.close()


def robustness(server: Server) -> dict[str, str]:
    half_head = b"GET /accelerator/ HTTP/1.1\r\nHost: x\r\n"
    slow_body = (f"POST {V2}/device_profiles HTTP/1.1\r\nHost: x\r\n"
                 "Content-Type: application/json\r\nContent-Length: 4096\r\n"
                 + "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
                 + "\r\n").encode() + b"[{"  # 2 of the 4,096 bytes announced
    return {
        "50 idle + 10 half heads": _probe_while_open(
            server, [_connect(server, half_head if i >= 50 else b"") for i in range(60)]),
        "8 slow bodies": _probe_while_open(server, [_connect(server, slow_body)
                                                    for _ in range(8)]),
    }


# ---- report --------------------------------------------------------------------------------

def report(servers: list[Server], workloads: list[Workload], connections: list[int],
           close: bool) -> str:
    first = servers[0]
    lines = []
    for conns in connections:
        mode = f"{conns} connections, " + ("Connection: close" if close else "kept alive")
        lines += [f"\n{mode} (median of rounds; ratio to {first.name}; CPU per request)\n",
                  "| workload | " + " | ".join(s.name for s in servers) + " |",
                  "|---|" + "---|" * len(servers)]
        for w in workloads:
            base = first.results.get((w.name, conns))
            cells = []
            for s in servers:
                samples = s.results.get((w.name, conns), [])
                if not samples:
                    cells.append("-")
                    continue
                rate = statistics.median(x.rate for x in samples)
                cpu = statistics.median(x.cpu_us for x in samples)
                p50 = statistics.median(x.p50_ms for x in samples)
                ratio = rate / statistics.median(x.rate for x in base) if base else 0.0
                errors = sum(x.errors for x in samples)
                cells.append(f"{rate:,.0f} ({ratio:.2f}x, {p50:.1f} ms, {cpu:,.0f} us)"
                             + (f" {errors} errors" if errors else ""))
            lines.append(f"| {w.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--candidate", action="append", default=[])
    parser.add_argument("--connections", action="append", type=int, default=[])
    parser.add_argument("--close", action="store_true",
                        help="a connection per request (Connection: close)")
    parser.add_argument("--robustness", action="store_true")
    parser.add_argument("--workload", action="append", default=[],
                        help="only workloads whose name contains this (repeatable)")
    parser.add_argument("--baseline-tree")
    args = parser.parse_args(argv)
    if not wrk.available():
        raise SystemExit("wrk is needed (apt-get install wrk)")
    names = args.candidate or list(DEFAULT_CANDIDATES)
    if args.baseline_tree and not any(n.startswith("baseline") for n in names):
        names.insert(0, "baseline")
    connections = args.connections or [4]
    workloads = [w for w in WORKLOADS
                 if not args.workload or any(p in w.name for p in args.workload)]
    with tempfile.TemporaryDirectory(prefix="acceld-serve-") as tmp:
        root = Path(tmp)
        template = seed_template(root / "template")
        servers: list[Server] = []
        try:
            for name in names:
                server = start(name, root, template, args.baseline_tree)
                if server is not None:
                    servers.append(server)
            log("serving: " + ", ".join(s.name for s in servers))
            for workload in workloads:
                for conns in connections:
                    for round_ in range(args.rounds):
                        order = servers if round_ % 2 == 0 else list(reversed(servers))
                        for server in order:
                            sample = measure(server, workload, conns, args.seconds,
                                             args.close)
                            server.results.setdefault((workload.name, conns), []).append(sample)
                            log(f"{workload.name}, {conns} conns, {server.name}: "
                                f"{sample.rate:,.0f} req/s, {sample.cpu_us:,.0f} us CPU")
            print(report(servers, workloads, connections, args.close))
            if args.robustness:
                print("\n| candidate | 50 idle + 10 half heads | 8 slow bodies |\n|---|---|---|")
                for server in servers:
                    found = robustness(server)
                    print(f"| {server.name} | {found['50 idle + 10 half heads']} | "
                          f"{found['8 slow bodies']} |")
        finally:
            for server in servers:
                stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
