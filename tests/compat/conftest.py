"""A real ``acceld all`` for the client compatibility suites, shared by the whole session.

The clients (openstacksdk, the ``openstack`` CLI, Nova's request sequence) talk
to it over loopback HTTP exactly as they would to a deployment: nothing is
imported from acceld into the client side. The server runs the fake driver
under a fixed host name so that devices, deployables and attach handles exist;
every port is a free one and the process group is stopped by PID afterwards.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Iterator

import pytest
import requests

from tests.support import allinone
from tests.support.allinone import free_port

HOSTNAME = "compat-node"
START_TIMEOUT = 60.0
DEVICE_TIMEOUT = 30.0
# An image id the agent finds in its bitstream directory (clouds without Glance).
BITSTREAM_ID = "8f2a6c1e-6a55-4b7e-9d3e-4b1f5a0c9e21"


@dataclass
class AcceldAll:
    """One running ``acceld all``: its public URL, its process, and what it printed."""

    proc: subprocess.Popen
    url: str  # the catalog endpoint, .../accelerator/v2
    state_path: str
    lines: list[str] = field(default_factory=list)

    @property
    def root(self) -> str:
        """scheme://host:port, without the /accelerator/v2 suffix."""
        return self.url.rsplit("/accelerator/v2", 1)[0]

    def child_pid(self, service: str) -> int | None:
        """PID of one service subprocess (``conductor``, ``api``, ``agent``) of this all-in-one."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except (OSError, ValueError, IndexError):
                continue
            if service.encode() in argv:
                return int(entry)
        return None


def _write_config(path: str, conductor_port: int, agent_port: int, bitstreams: str) -> None:
    with open(path, "w") as handle:
        handle.write(f"""[DEFAULT]
host = {HOSTNAME}

[conductor]
port = {conductor_port}
bind_poll_interval = 0.2

[agent]
port = {agent_port}
enabled_drivers = fake
heartbeat_interval = 1
discovery_interval = 5
bitstream_dir = {bitstreams}

[placement]
check_allocations = false
""")


def start_acceld_all(state_path: str) -> AcceldAll:
    os.makedirs(state_path, exist_ok=True)
    config_file = os.path.join(state_path, "acceld.conf")
    bitstreams = os.path.join(state_path, "bitstreams")
    os.makedirs(bitstreams, exist_ok=True)
    with open(os.path.join(bitstreams, BITSTREAM_ID), "wb") as handle:
        handle.write(b"\x00acceld compat-test bitstream\x00" * 64)
    _write_config(config_file, free_port(), free_port(), bitstreams)
    launched = allinone.launch(state_path, config_file, timeout=START_TIMEOUT)
    return AcceldAll(proc=launched.proc, url=launched.url, state_path=state_path,
                     lines=launched.lines)


@pytest.fixture(scope="session")
def acceld_all(tmp_path_factory) -> Iterator[AcceldAll]:
    server = start_acceld_all(str(tmp_path_factory.mktemp("acceld-all")))
    try:
        yield server
    finally:
        allinone.stop(server.proc)


@pytest.fixture(scope="session")
def http(acceld_all) -> Iterator[requests.Session]:
    """A plain HTTP session with the all-in-one's defaults (no identity headers)."""
    session = requests.Session()
    yield session
    session.close()


@pytest.fixture(scope="session")
def fake_deployable(acceld_all, http) -> dict:
    """The fake driver's deployable on HOSTNAME, once the conductor has reconciled it."""
    deadline = time.monotonic() + DEVICE_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        last = http.get(f"{acceld_all.url}/deployables")
        if last.status_code == 200:
            mine = [d for d in last.json()["deployables"]
                    if d["name"].startswith(f"{HOSTNAME}_")]
            if mine:
                return mine[0]
        time.sleep(0.2)
    detail = f"{last.status_code} {last.text[:300]}" if last is not None else "no answer"
    raise AssertionError(f"No deployable of {HOSTNAME} appeared within {DEVICE_TIMEOUT}s "
                         f"(last GET /deployables: {detail})")


@pytest.fixture(scope="session")
def fake_device(acceld_all, http, fake_deployable) -> dict:
    resp = http.get(f"{acceld_all.url}/devices", params={"hostname": HOSTNAME})
    assert resp.status_code == 200, resp.text
    devices = [d for d in resp.json()["devices"] if d["hostname"] == HOSTNAME]
    assert devices, resp.text
    return devices[0]


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"
