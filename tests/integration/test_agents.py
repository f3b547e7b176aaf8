"""One conductor, three agents and one external driver process, as real processes on loopback.

Agents ``node-a`` and ``node-b`` run the fake driver in process (their
simulated hardware comes from spec files the test rewrites); ``node-c`` runs
the PCI driver on a fixture sysfs tree and has an external ``acceld driver
fake`` process registered with it. The inventory is read through the public
API (the in-process app on the same database). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import requests
from falcon import testing

from acceld.api.app import build_app
from acceld.clients.internal import InternalClient, InternalError
from acceld.db.engine import Database
from acceld.internal import auth
from acceld.runtime.secrets import ensure_secret_file
from tests.conftest import make_conf
from tests.helpers import ADMIN, version
from tests.support.databases import private_database
from tests.support.sysfs_fixtures import SysfsTree
from tests.support.net import free_port

pytestmark = pytest.mark.integration

HEARTBEAT = 1
SWEEP = 0.25
DOWN_AFTER = 3


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Process:
    """One acceld process, its log in a file; stopped by pid."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, port: int) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "acceld.cmd.main", *argv]
        self.log_path = log_dir / f"{name}.log"
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Process":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"{self.name} did not start:\n{self.log()}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def write_conf(path: Path, sections: dict[str, dict[str, object]]) -> str:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return str(path)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db_url(request, tmp_path):
    with private_database(request.param, tmp_path) as url:
        yield url


class Cluster:
    def __init__(self, tmp_path: Path, db_url: str) -> None:
        self.dir = tmp_path
        self.state = tmp_path / "state"
        ensure_secret_file(str(self.state))
        self.secret = (self.state / "internal.secret").read_text().strip().encode()
        self.signer = lambda host: auth.Signer(auth.node_key(self.secret, host), host)
        self.conductor_port = free_port()
        self.common = {
            "DEFAULT": {"state_path": self.state},
            "database": {"connection": db_url},
            "conductor": {"port": self.conductor_port, "agent_check_interval": SWEEP,
                          "agent_down_intervals": DOWN_AFTER},
            "agent": {"heartbeat_interval": HEARTBEAT, "discovery_interval": 1},
        }
        self.base_conf = write_conf(tmp_path / "base.conf", self.common)
        self.processes: dict[str, Process] = {}
        self.ports: dict[str, int] = {}

    def spec(self, name: str, devices: list[dict]) -> str:
        path = self.dir / f"{name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(devices))
        os.replace(tmp, path)
        return str(path)

    def conductor(self) -> Process:
        proc = Process("conductor", ["conductor", "--config-file", self.base_conf],
                       self.dir, self.conductor_port)
        self.processes["conductor"] = proc
        return proc.start()

    def agent_conf(self, host: str, drivers: str, extra: dict) -> str:
        sections = {k: dict(v) for k, v in self.common.items()}
        sections["DEFAULT"]["host"] = host
        sections["agent"].update({"enabled_drivers": drivers, "port": self.ports[host]})
        sections["conductor"]["url"] = f"http://127.0.0.1:{self.conductor_port}"
        for section, values in extra.items():
            sections.setdefault(section, {}).update(values)
        return write_conf(self.dir / f"{host}.conf", sections)

    def agent(self, host: str, drivers: str = "fake", **extra: dict) -> Process:
        self.ports.setdefault(host, free_port())
        conf = self.agent_conf(host, drivers, extra)
        proc = Process(host, ["agent", "--config-file", conf], self.dir, self.ports[host])
        self.processes[host] = proc
        return proc.start()

    def driver(self, name: str, host: str, **extra: dict) -> Process:
        port = free_port()
        self.ports[f"driver-{name}"] = port
        conf = self.agent_conf(host, "", extra)
        proc = Process(f"driver-{name}", ["driver", name, "--config-file", conf, "--port",
                                          str(port), "--agent-url",
                                          f"http://127.0.0.1:{self.ports[host]}"],
                       self.dir, port)
        self.processes[proc.name] = proc
        return proc.start()

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            proc.stop()


@pytest.fixture
def cluster(tmp_path, db_url):
    cluster = Cluster(tmp_path, db_url)
    yield cluster
    cluster.stop()


def test_agents_report_reconcile_and_liveness(cluster, db_url, tmp_path):
    conf = make_conf(str(cluster.state), database__connection=db_url)
    db = Database(db_url)
    api = testing.TestClient(build_app(conf, db))

    def devices(host: str) -> list[dict]:
        result = api.simulate_get("/accelerator/v2/devices", params={"hostname": host},
                                  headers=ADMIN)
        assert result.status_code == 200, result.text
        return result.json["devices"]

    def hosts() -> dict[str, dict]:
        result = api.simulate_get("/accelerator/v2/hosts", headers={**ADMIN, **version("2.4")})
        assert result.status_code == 200, result.text
        return {h["hostname"]: h for h in result.json["hosts"]}

    def types(host: str) -> list[str]:
        return sorted(d["type"] for d in devices(host))

    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:17:00.0", "0x10de", "0x2335", "0x030200", driver="vfio-pci")
    try:
        cluster.conductor()
        cluster.agent("node-a", fake_driver={"spec_file": cluster.spec(
            "a", [{"type": "FPGA"}, {"type": "GPU", "attach_handles": 2}])})
        cluster.agent("node-b", fake_driver={"spec_file": cluster.spec("b", [{"type": "FPGA"}])})
        cluster.agent("node-c", drivers="pci", pci_driver={"sysfs_root": tree.root})
        cluster.driver("fake", "node-c", fake_driver={"spec_file": cluster.spec(
            "c", [{"type": "QAT", "attach_handles": 4}])})

        # The inventory of every node appears through the public API.
        wait_for(lambda: types("node-a") == ["FPGA", "GPU"], 20, "node-a's inventory")
        wait_for(lambda: types("node-b") == ["FPGA"], 20, "node-b's inventory")
        wait_for(lambda: types("node-c") == ["GPU", "QAT"], 20,
                 "node-c's PCI device and its external driver's device")
        names = {d["name"]: d for d in api.simulate_get(
            "/accelerator/v2/deployables", headers=ADMIN).json["deployables"]}
        assert {"node-a_FakeDevice", "node-a_FakeDevice1", "node-b_FakeDevice",
                "node-c_0000:17:00.0", "node-c_FakeDevice"} == set(names)
        assert names["node-c_FakeDevice"]["driver_name"] == "fake"
        assert names["node-c_0000:17:00.0"]["driver_name"] == "pci"
        assert set(hosts()) == {"node-a", "node-b", "node-c"}

        # A device removed from a driver disappears: in process (rescanned every second)...
        cluster.spec("a", [{"type": "FPGA"}])
        wait_for(lambda: types("node-a") == ["FPGA"], 15, "node-a's GPU to disappear")
        # ... and in an external driver process, after a discovery asked of the agent.
        cluster.spec("c", [])
        agent_c = InternalClient(f"http://127.0.0.1:{cluster.ports['node-c']}",
                                 cluster.signer("node-c"),
                                 destination=auth.agent_destination("node-c"))
        assert agent_c.call("POST", "/discovery", {}) == {"status": "IN-PROGRESS"}
        wait_for(lambda: types("node-c") == ["GPU"], 15, "node-c's QAT to disappear")

        # Internal calls without a valid credential are refused, in every direction.
        endpoints = {"conductor": cluster.conductor_port, "agent": cluster.ports["node-c"],
                     "driver": cluster.ports["driver-fake"]}
        for port in endpoints.values():
            base = f"http://127.0.0.1:{port}"
            assert requests.get(f"{base}/hardware", timeout=5).status_code == 401
            assert requests.post(f"{base}/hello", json={"status": "READY"},
                                 timeout=5).status_code == 401
            wrong = auth.sign(b"not-the-secret", "GET", "/hardware")
            assert requests.get(f"{base}/hardware", headers={auth.HEADER: wrong},
                                timeout=5).status_code == 401
        signed, _nonce = cluster.signer("node-c").headers(
            "GET", "/hardware", destination=auth.agent_destination("node-c"))
        base = f"http://127.0.0.1:{cluster.ports['node-c']}"
        assert requests.get(f"{base}/hardware", headers=signed, timeout=5).status_code == 200
        assert requests.get(f"{base}/hardware", headers=signed,
                            timeout=5).status_code == 401  # replayed
        # A node speaks only for itself: node-a's key opens neither node-c's agent...
        with pytest.raises(InternalError) as refused:
            InternalClient(base, cluster.signer("node-a"),
                           destination=auth.agent_destination("node-c")).call("GET", "/hardware")
        assert refused.value.status == 401
        # ... nor a hello for node-b that would redirect the conductor's calls for it.
        before = hosts()["node-b"]
        conductor_as_a = InternalClient(f"http://127.0.0.1:{cluster.conductor_port}",
                                        cluster.signer("node-a"), destination=auth.CONDUCTOR)
        with pytest.raises(InternalError) as refused:
            conductor_as_a.call("POST", "/hello", {"status": "READY", "hostname": "node-b",
                                                   "endpoint": "127.0.0.1:9"})
        assert refused.value.status == 401
        assert hosts()["node-b"]["endpoint"] == before["endpoint"] != "127.0.0.1:9"
        # A malformed hello with a valid credential is a 400, not a registration.
        conductor = InternalClient(f"http://127.0.0.1:{cluster.conductor_port}", cluster.secret,
                                   destination=auth.CONDUCTOR)
        with pytest.raises(InternalError) as refused:
            conductor.call("POST", "/hello", {"status": "READY", "endpoint": "nowhere"})
        assert refused.value.status == 400
        assert set(hosts()) == {"node-a", "node-b", "node-c"}

        # A killed agent is marked down within three intervals, with a WARNING...
        killed_at = time.monotonic()
        cluster.processes["node-b"].kill9()
        wait_for(lambda: hosts()["node-b"]["state"] == "down",
                 HEARTBEAT * DOWN_AFTER + SWEEP + 2, "node-b to be marked down")
        assert time.monotonic() - killed_at <= HEARTBEAT * DOWN_AFTER + SWEEP + 2
        log = cluster.processes["conductor"].log()
        assert "WARNING" in log and "host node-b is down: last contact" in log
        assert hosts()["node-a"]["state"] == "up"
        assert types("node-b") == ["FPGA"]  # its inventory stays
        # ... and recovers when it comes back.
        cluster.agent("node-b", fake_driver={"spec_file": str(cluster.dir / "b.json")})
        wait_for(lambda: hosts()["node-b"]["state"] == "up", 15, "node-b to come back")

        # `acceld status` lists the agents from the database.
        status = subprocess.run([sys.executable, "-m", "acceld.cmd.main", "status", "--config-file",
                                 cluster.base_conf], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert all(f"node-{n}" in status.stdout for n in "abc")

        # A conductor restart loses nothing.
        def snapshot():
            return ({h: sorted((d["uuid"], d["type"]) for d in devices(h))
                     for h in ("node-a", "node-b", "node-c")},
                    sorted((d["uuid"], d["name"]) for d in api.simulate_get(
                        "/accelerator/v2/deployables", headers=ADMIN).json["deployables"]))
        before = snapshot()
        cluster.processes["conductor"].stop()
        cluster.conductor()
        wait_for(lambda: all(h["state"] == "up" for h in hosts().values()) and
                 all(time.time() - _epoch(h["last_seen_at"]) < 2 for h in hosts().values()),
                 20, "every agent to report to the new conductor")
        assert snapshot() == before
    finally:
        db.dispose()


def _epoch(timestamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(timestamp).timestamp()
