"""Upstream Cyborg 17.0.0, run standalone beside acceld for the side-by-side benchmark.

Installed from PyPI into a virtualenv of its own (``.upstream/venv``, git-ignored,
reused when present). No Keystone: the shipped paste pipeline without
``authtoken``, identity from the ``X-Roles``/``X-Project-Id``/``X-Service-Roles``
headers. Writes are RPC calls to ``cyborg-conductor`` over RabbitMQ
(127.0.0.1:5672, guest/guest); the conductor needs Placement; the agent's fake
driver provides the device the ARQ lifecycle binds to; a minimal Nova endpoint
takes the bind events. The API is ``cyborg.wsgi.api:application`` in gunicorn
with one sync worker, mounted at ``/accelerator`` as deployments do.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / ".upstream"
VENV = BASE / "venv"
STAMP = VENV / ".installed-17.0.0-h1c"
# The same gunicorn, with the same C HTTP parser, as acceld's API gets: one server stack.
PACKAGES = ["openstack-cyborg==17.0.0", "gunicorn>=23,<28", "gunicorn-h1c>=0.6"]
HOSTNAME = "bench-node"
# Upstream insists on UUID-shaped project ids (Keystone's); both sides get the same headers.
HEADERS = {"X-User-Id": "5f0c8a8e1b7d4f6c9a2e3b4c5d6e7f80",
           "X-Project-Id": "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5",
           "X-Roles": "admin,member,reader", "X-Service-Roles": "service"}

_WSGI_SHIM = """\
# Loads upstream's WSGI module with its config file: the module parses sys.argv itself.
import sys
sys.argv = ["cyborg-api", "--config-file", {conf!r}]
from cyborg.wsgi.api import application  # noqa: E402,F401
"""


def ensure_venv(log=print) -> Path:  # type: ignore[no-untyped-def]
    """Create and install the upstream virtualenv once (about a minute)."""
    if STAMP.exists():
        return VENV
    log(f"installing {' '.join(PACKAGES)} into {VENV} ...")
    started = time.monotonic()
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base_python, "-m", "venv", "--clear", str(VENV)], check=True)
    done = subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", *PACKAGES],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"installing upstream failed:\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")
    STAMP.touch()
    log(f"installed in {time.monotonic() - started:.0f} s")
    return VENV


class UpstreamCyborg:
    """Conductor, agent and API of upstream Cyborg over one SQLite database."""

    def __init__(self, workdir: Path, api_port: int, placement_url: str, nova_url: str) -> None:
        self.workdir = Path(workdir)
        self.api_port = api_port
        self.root = f"http://127.0.0.1:{api_port}/accelerator"
        self.url = f"{self.root}/v2"
        self.placement_url = placement_url
        self.nova_url = nova_url
        self.db_path = self.workdir / "cyborg.sqlite"
        self.conf = self.workdir / "cyborg.conf"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- setup ----------------------------------------------------------------------------

    def configure(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        paste = self.workdir / "api-paste.ini"
        shipped = (VENV / "etc" / "cyborg" / "api-paste.ini").read_text()
        paste.write_text(shipped.replace("request_id authtoken api_v2", "request_id api_v2"))
        self.conf.write_text(f"""[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:5672/
host = {HOSTNAME}
state_path = {self.workdir}
debug = False
log_dir = {self.workdir}

[api]
api_paste_config = {paste}
host_ip = 127.0.0.1
port = {self.api_port}

[database]
connection = sqlite:///{self.db_path}

[oslo_policy]
enforce_new_defaults = False

[agent]
enabled_drivers = fake_driver
resource_provider_name = {HOSTNAME}

[placement]
auth_type = admin_token
endpoint = {self.placement_url}
token = admin

[nova]
auth_type = admin_token
endpoint = {self.nova_url}
token = admin
""")
        (self.workdir / "cyborg_bench_wsgi.py").write_text(_WSGI_SHIM.format(conf=str(self.conf)))
        if self.db_path.exists():
            self.db_path.unlink()
        # `upgrade` fails on SQLite (an ALTER COLUMN); create_schema builds the same tables.
        subprocess.run([str(VENV / "bin" / "cyborg-dbsync"), "--config-file", str(self.conf),
                        "create_schema"], check=True, capture_output=True, timeout=120)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def start_backend(self) -> None:
        """Conductor and agent (the agent reports the fake FPGA through the conductor)."""
        self._spawn("conductor", [str(VENV / "bin" / "cyborg-conductor"),
                                  "--config-file", str(self.conf)])
        time.sleep(1.0)
        self._spawn("agent", [str(VENV / "bin" / "cyborg-agent"),
                              "--config-file", str(self.conf)])

    def start_api(self) -> float:
        """Start the API; return seconds from spawn to the first 200 on the version document."""
        started = time.monotonic()
        self._spawn("api", [str(VENV / "bin" / "gunicorn"), "--workers", "1",
                            "--worker-class", "sync", "--bind", f"127.0.0.1:{self.api_port}",
                            "--timeout", "300", "--no-control-socket",
                            "--env", "SCRIPT_NAME=/accelerator",
                            "--chdir", str(self.workdir), "cyborg_bench_wsgi:application"])
        return started_to_200(self.procs["api"], self.root + "/", started, 90.0,
                              self.workdir / "api.out")

    def wait_for_device(self, timeout: float = 90.0) -> dict:
        """The fake driver's deployable, once the agent reported it and Placement has it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"upstream {name} exited {proc.returncode}:\n"
                                       + tail(self.workdir / f"{name}.out"))
            try:
                resp = requests.get(self.url + "/deployables", headers=HEADERS, timeout=30)
                found = resp.json().get("deployables", []) if resp.status_code == 200 else []
            except requests.RequestException:
                found = []
            ready = [d for d in found if d.get("rp_uuid")]
            if ready:
                return ready[0]
            time.sleep(1.0)
        raise RuntimeError("upstream agent reported no deployable:\n"
                           + tail(self.workdir / "agent.out"))

    def stop(self) -> None:
        for name in ("api", "agent", "conductor"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_process(proc)

    # -- data, inserted directly into upstream's tables -------------------------------------

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=30)

    def seed_profiles(self, count: int, prefix: str) -> None:
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._db() as conn:
            conn.executemany(
                "INSERT INTO device_profiles (uuid, name, profile_json, description, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                [(str(uuid.uuid4()), f"{prefix}-{i}", _profile_json(), "bench", now)
                 for i in range(count)])

    def seed_arqs(self, count: int, profile_name: str) -> None:
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._db() as conn:
            (profile_id,) = conn.execute("SELECT id FROM device_profiles WHERE name = ?",
                                         (profile_name,)).fetchone()
            conn.executemany(
                "INSERT INTO extended_accelerator_requests (uuid, project_id, state,"
                " device_profile_id, device_profile_group_id, substate, created_at)"
                " VALUES (?, ?, 'Initial', ?, 0, 'Initial', ?)",
                [(str(uuid.uuid4()), HEADERS["X-Project-Id"], profile_id, now)
                 for _ in range(count)])

    def seed_devices(self, count: int) -> None:
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._db() as conn:
            conn.executemany(
                "INSERT INTO devices (uuid, type, vendor, model, std_board_info,"
                " vendor_board_info, hostname, status, created_at)"
                " VALUES (?, 'GPU', '10de', 'bench-model', ?, '{}', ?, 'enabled', ?)",
                [(str(uuid.uuid4()), '{"product_id": "1db4"}', f"host-{i // 8}", now)
                 for i in range(count)])

    def delete_arqs(self) -> None:
        with self._db() as conn:
            conn.execute("DELETE FROM extended_accelerator_requests")

    def delete_seeded_devices(self) -> None:
        with self._db() as conn:
            conn.execute("DELETE FROM devices WHERE model = 'bench-model'")


def _profile_json() -> str:
    return '{"groups": [{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}]}'


def started_to_200(proc: subprocess.Popen, url: str, started: float, timeout: float,
                   log: Path) -> float:
    """Poll ``url`` until it answers 200; the seconds since ``started``."""
    deadline = started + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}:\n{tail(log)}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s:\n{tail(log)}")


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started, SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""
