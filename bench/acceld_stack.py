"""acceld as the benchmark runs it: ``acceld api`` (one sync worker), conductor and agent.

Same machine, same database engine (SQLite) and same workloads as upstream.
The agent runs the fake driver under the benchmark's host name so the ARQ
lifecycle binds to a real reconciled device, as upstream's does. Data for the
list workloads is inserted directly into acceld's tables through its own
schema (SQLAlchemy Core), the same rows upstream gets in its tables.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import requests
from sqlalchemy import delete, insert, select

from acceld.db.engine import Database
from acceld.db.models import accelerator_requests, bind_jobs, device_profiles, devices, utcnow
from acceld.runtime.secrets import ensure_secret_file
from bench.upstream import HEADERS, HOSTNAME, started_to_200, stop_process, tail

ACCELD = [sys.executable, "-m", "acceld.cmd.main"]


def has_subcommand(name: str) -> bool:
    out = subprocess.run([*ACCELD, name, "--help"], capture_output=True, text=True)
    return out.returncode == 0


class AcceldStack:
    def __init__(self, workdir: Path, api_port: int, conductor_port: int, agent_port: int,
                 extra_config: str = "") -> None:
        self.workdir = Path(workdir)
        self.api_port = api_port
        self.root = f"http://127.0.0.1:{api_port}/accelerator"
        self.url = f"{self.root}/v2"
        self.conf = self.workdir / "acceld.conf"
        self.db_url = f"sqlite:///{self.workdir / 'acceld.sqlite'}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf_text = f"""[DEFAULT]
host = {HOSTNAME}
state_path = {self.workdir}

[api]
workers = 1
port = {api_port}

[database]
connection = {self.db_url}

[conductor]
port = {conductor_port}

[agent]
port = {agent_port}
enabled_drivers = fake

[placement]
check_allocations = false
{extra_config}"""

    def _argv(self, *args: str) -> list[str]:
        return [*ACCELD, *args, "--config-file", str(self.conf), "--state-path", str(self.workdir)]

    def configure(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.conf_text)
        ensure_secret_file(str(self.workdir))
        subprocess.run(self._argv("db", "upgrade"), check=True, capture_output=True, timeout=120)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def start_backend(self) -> bool:
        """Conductor and, when this build has one, the agent; False without an agent."""
        self._spawn("conductor", self._argv("conductor"))
        if not has_subcommand("agent"):
            return False
        time.sleep(0.5)
        self._spawn("agent", self._argv("agent"))
        return True

    def start_api(self) -> float:
        started = time.monotonic()
        self._spawn("api", self._argv("api", "--workers", "1"))
        return started_to_200(self.procs["api"], self.root + "/", started, 60.0,
                              self.workdir / "api.out")

    def wait_for_device(self, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"acceld {name} exited {proc.returncode}:\n"
                                       + tail(self.workdir / f"{name}.out"))
            resp = requests.get(self.url + "/deployables", headers=HEADERS, timeout=30)
            if resp.status_code == 200:
                ready = [d for d in resp.json()["deployables"]
                         if d.get("rp_uuid") and d["name"].startswith(HOSTNAME)]
                if ready:
                    return ready[0]
            time.sleep(0.2)
        raise RuntimeError("acceld reported no deployable:\n" + tail(self.workdir / "agent.out"))

    def stop(self) -> None:
        for name in ("api", "agent", "conductor"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                stop_process(proc)

    # -- data, inserted directly into acceld's tables ---------------------------------------

    def _db(self) -> Database:
        return Database(self.db_url)

    def seed_profiles(self, count: int, prefix: str) -> None:
        db = self._db()
        groups = orjson.dumps([{"resources:FPGA": "1",
                                "trait:CUSTOM_FAKE_DEVICE": "required"}]).decode()
        with db.write() as conn:
            conn.execute(insert(device_profiles), [
                {"uuid": str(uuid.uuid4()), "name": f"{prefix}-{i}", "profile_json": groups,
                 "description": "bench", "created_at": utcnow()} for i in range(count)])
        db.dispose()

    def seed_arqs(self, count: int, profile_name: str) -> None:
        db = self._db()
        with db.write() as conn:
            profile_id = conn.execute(select(device_profiles.c.id).where(
                device_profiles.c.name == profile_name)).scalar_one()
            conn.execute(insert(accelerator_requests), [
                {"uuid": str(uuid.uuid4()), "state": "Initial", "device_profile_id": profile_id,
                 "device_profile_group_id": 0, "project_id": HEADERS["X-Project-Id"],
                 "created_at": utcnow()} for _ in range(count)])
        db.dispose()

    def seed_devices(self, count: int) -> None:
        db = self._db()
        with db.write() as conn:
            conn.execute(insert(devices), [
                {"uuid": str(uuid.uuid4()), "type": "GPU", "vendor": "10de",
                 "model": "bench-model", "std_board_info": '{"product_id": "1db4"}',
                 "vendor_board_info": "{}", "hostname": f"host-{i // 8}", "status": "enabled",
                 "acc_status": "ready", "vanished": False, "created_at": utcnow()}
                for i in range(count)])
        db.dispose()

    def delete_arqs(self) -> None:
        db = self._db()
        with db.write() as conn:
            conn.execute(delete(bind_jobs))
            conn.execute(delete(accelerator_requests))
        db.dispose()

    def delete_seeded_devices(self) -> None:
        db = self._db()
        with db.write() as conn:
            conn.execute(delete(devices).where(devices.c.model == "bench-model"))
        db.dispose()
