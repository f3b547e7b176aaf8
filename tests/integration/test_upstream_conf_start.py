"""acceld's API, conductor and agent started from upstream Cyborg's cyborg.conf as kolla-ansible
and devstack write it, unchanged, plus a second file with what acceld adds (its [database],
its [internal] shared_secret, its state path and the conductor's and agent's ports, free
ones here): every service
starts, the API authenticates with Keystone (upstream always does), the agent runs
upstream's ``fake_driver`` under acceld's name, and each service names the options it does
not use in one WARNING."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from sqlalchemy import select

from acceld.db.engine import Database
from acceld.db.models import devices
from tests.support.net import free_port
from tests.unit.test_upstream_conf import render

pytestmark = pytest.mark.integration

SERVICES = ("conductor", "api", "agent")
WARNING = "that acceld does not use"


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("fixture", ["kolla-cyborg.conf", "devstack-cyborg.conf"])
def test_services_start_from_an_upstream_cyborg_conf(tmp_path, fixture) -> None:
    api_port, conductor_port, agent_port = free_port(), free_port(), free_port()
    (tmp_path / "log").mkdir()
    cyborg_conf = render(fixture, tmp_path, api_port=api_port, host="compute-01",
                         keystone_url=f"http://127.0.0.1:{free_port()}/identity")
    db_url = f"sqlite:///{tmp_path / 'acceld.sqlite'}"
    acceld_conf = tmp_path / "acceld.conf"
    acceld_conf.write_text(f"[DEFAULT]\nstate_path = {tmp_path / 'state'}\n"
                           f"[database]\nconnection = {db_url}\n"
                           f"[internal]\nshared_secret = {secrets.token_hex(32)}\n"
                           f"[conductor]\nport = {conductor_port}\n"
                           f"[agent]\nport = {agent_port}\nheartbeat_interval = 1\n"
                           "discovery_interval = 1\n")
    files = ["--config-file", str(cyborg_conf), "--config-file", str(acceld_conf)]
    base = [sys.executable, "-m", "acceld.cmd.main"]
    upgraded = subprocess.run([*base, "db", "upgrade", *files], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    procs: dict[str, subprocess.Popen] = {}
    try:
        for service, port in zip(SERVICES, (conductor_port, api_port, agent_port)):
            err = open(tmp_path / f"{service}.stderr", "wb")
            procs[service] = subprocess.Popen([*base, service, *files], stdout=subprocess.DEVNULL,
                                              stderr=err, cwd=tmp_path, start_new_session=True)
            deadline = time.monotonic() + 60
            while not _listening(port):
                assert procs[service].poll() is None, \
                    f"{service} exited:\n{(tmp_path / f'{service}.stderr').read_text()}"
                assert time.monotonic() < deadline, f"{service} did not listen"
                time.sleep(0.1)

        # Keystone authentication, as upstream: no token, no answer.
        answer = requests.get(f"http://127.0.0.1:{api_port}/accelerator/v2/device_profiles",
                              timeout=10)
        assert answer.status_code == 401, answer.text

        # The agent loaded fake_driver (acceld's fake) and its device reached the database.
        db = Database(db_url)
        deadline = time.monotonic() + 60
        while True:
            with db.read() as conn:
                hosts = conn.execute(select(devices.c.hostname)).scalars().all()
            if hosts:
                break
            assert time.monotonic() < deadline, "the agent's fake device never arrived"
            time.sleep(0.2)
        assert hosts == ["compute-01"]
        db.dispose()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    for service in SERVICES:
        if fixture.startswith("kolla"):  # log_dir: one file per service, as upstream's
            text = (tmp_path / "log" / f"acceld-{service}.log").read_text()
        else:  # devstack: no log_dir, journald takes standard error
            text = (tmp_path / f"{service}.stderr").read_text()
        warnings = [line for line in text.splitlines() if WARNING in line]
        assert len(warnings) == 1, (service, warnings)
        assert "[DEFAULT] transport_url" in warnings[0]
        assert "[oslo_concurrency]" in warnings[0]
        assert "api_workers" not in warnings[0]
        assert "Traceback" not in text, (service, text[-3000:])
