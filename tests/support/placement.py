"""A real OpenStack Placement service for tests: openstack-placement in its own virtualenv.

The virtualenv lives at ``.placement/venv`` in the repository (git-ignored) and
is created once (``make test`` does it through the ``.placement/venv/.installed``
stamp; :func:`ensure_venv` does the same when a test runs without make). Each
:class:`PlacementServer` gets its own SQLite database and config directory,
runs ``placement-manage db sync`` and serves ``placement.wsgi.api:application``
with gunicorn on a free loopback port, with ``noauth2`` (send
``x-auth-token: admin``). It can be stopped and started again on the same port
and database, which is how tests play "Placement went away and came back".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".placement" / "venv"
STAMP = VENV / ".installed"
REQUIREMENTS = Path(__file__).with_name("placement-requirements.txt")
MICROVERSION = "1.39"
TOKEN = "admin"


def ensure_venv() -> Path:
    """The Placement virtualenv, created and installed when missing (about a minute)."""
    if STAMP.exists():
        return VENV
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base_python, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "-r", str(REQUIREMENTS)], check=True)
    STAMP.touch()
    return VENV


class PlacementServer:
    """One Placement process (gunicorn, one sync worker) over its own SQLite database."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "placement.log"
        self._synced = False

    # -- lifecycle ---------------------------------------------------------------------------

    def _configure(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "placement.conf").write_text(
            "[DEFAULT]\n"
            "debug = False\n"
            "[api]\n"
            "auth_strategy = noauth2\n"
            "[placement_database]\n"
            f"connection = sqlite:///{self.workdir / 'placement.sqlite'}\n")
        if not self._synced:
            subprocess.run([str(VENV / "bin" / "placement-manage"), "--config-file",
                            str(self.workdir / "placement.conf"), "db", "sync"],
                           check=True, capture_output=True, timeout=120)
            self._synced = True

    def start(self, timeout: float = 30.0) -> "PlacementServer":
        ensure_venv()
        self._configure()
        env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=str(self.workdir))
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "gunicorn"), "--no-control-socket", "--workers", "1",
             "--bind", f"127.0.0.1:{self.port}", "--timeout", "60",
             "placement.wsgi.api:application"],
            cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Placement exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                if requests.get(self.url + "/", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Placement did not answer within {timeout} s:\n" + self.log_tail())

    def stop(self, kill: bool = False) -> None:
        """Stop the server by PID (SIGKILL when ``kill``: a crash, not a shutdown)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # -- a plain HTTP view, for assertions (independent of acceld's client) -------------------

    def headers(self, microversion: str = MICROVERSION) -> dict[str, str]:
        return {"x-auth-token": TOKEN, "OpenStack-API-Version": f"placement {microversion}",
                "Accept": "application/json"}

    def get(self, path: str, **params: str) -> requests.Response:
        return requests.get(self.url + path, params=params, headers=self.headers(), timeout=10)

    def put(self, path: str, body: object) -> requests.Response:
        return requests.put(self.url + path, json=body, headers=self.headers(), timeout=10)

    def post(self, path: str, body: object) -> requests.Response:
        return requests.post(self.url + path, json=body, headers=self.headers(), timeout=10)

    def delete(self, path: str) -> requests.Response:
        return requests.delete(self.url + path, headers=self.headers(), timeout=10)

    def create_compute_node(self, name: str, vcpus: int = 16,
                            memory_mb: int = 65536) -> str:
        """What Nova's compute service does at start: a root provider with VCPU and memory."""
        resp = self.post("/resource_providers", {"name": name})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        inv = self.put(f"/resource_providers/{body['uuid']}/inventories", {
            "resource_provider_generation": body["generation"],
            "inventories": {"VCPU": {"total": vcpus}, "MEMORY_MB": {"total": memory_mb}}})
        assert inv.status_code == 200, inv.text
        return body["uuid"]

    def configure(self, conf) -> None:  # type: ignore[no-untyped-def]
        """Point acceld's ``[placement]`` options here (admin_token against noauth2)."""
        from keystoneauth1 import loading as ks_loading

        conf.register_opts(ks_loading.get_auth_plugin_conf_options("admin_token"),
                           group="placement")
        conf.set_override("auth_type", "admin_token", group="placement")
        conf.set_override("endpoint", self.url, group="placement")
        conf.set_override("token", TOKEN, group="placement")

    def config_lines(self) -> str:
        """The same as a config file section, for services started as processes."""
        return (f"[placement]\nauth_type = admin_token\nendpoint = {self.url}\n"
                f"token = {TOKEN}\n")


def assert_placement_matches_db(server: PlacementServer, db: Any, host: str,
                                reserve_down_agents: bool = True,
                                kept: dict[str, dict[str, Any]] | None = None) -> None:
    """Placement holds exactly the providers, inventories and traits acceld's DB asks for,
    plus what ``kept`` says of the operator's per provider (``reserved``, ``traits``)."""
    from acceld.placement_model import desired_providers

    with db.read() as conn:
        wanted = desired_providers(conn, [host], reserve_down_agents)
    root = server.get("/resource_providers", name=host).json()["resource_providers"][0]
    tree = server.get("/resource_providers", in_tree=root["uuid"]).json()
    children = {p["uuid"]: p for p in tree["resource_providers"] if p["uuid"] != root["uuid"]}
    assert set(children) == set(wanted), (sorted(children), sorted(wanted))
    for rp, want in wanted.items():
        operator = (kept or {}).get(rp, {})
        assert children[rp]["name"] == want.name
        assert children[rp]["parent_provider_uuid"] == root["uuid"]
        inv = server.get(f"/resource_providers/{rp}/inventories").json()["inventories"]
        reserved = min(want.total, max(want.reserved, operator.get("reserved", 0)))
        assert inv == ({want.resource_class: {
            "total": want.total, "max_unit": want.total, "reserved": reserved,
            "min_unit": 1, "step_size": 1, "allocation_ratio": 1.0}}
            if want.resource_class and want.total else {}), (want, inv)
        traits = server.get(f"/resource_providers/{rp}/traits").json()["traits"]
        assert sorted(traits) == sorted(set(want.traits) | operator.get("traits", set())), \
            (want, traits)
