"""`acceld all`: every service started, announced once it answers, all stopped by one signal."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.support import allinone
from tests.support.net import free_port


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_all_in_one_starts_announces_and_stops(tmp_path, stop_signal):
    api, conductor, agent = free_port(), free_port(), free_port()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nhost = aio-node\n[conductor]\nport = {conductor}\n"
                    f"[agent]\nport = {agent}\nenabled_drivers = fake\nheartbeat_interval = 1\n")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "acceld.cmd.main", "all", "--port", str(api), "--state-path",
         str(tmp_path / "state"), "--config-file", str(conf)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = []
        while len(lines) < 4:
            line = proc.stdout.readline()
            assert line, f"acceld all exited early: {lines}"
            lines.append(line.strip())
            assert time.monotonic() - started < 60
        # Once every service is up: where the dashboard is (a free port: none of the
        # ports browsers refuse, so no word of it).
        assert lines[3] == f"acceld dashboard: http://127.0.0.1:{api}/dashboard"
        assert f"acceld api: http://127.0.0.1:{api}/accelerator/v2" in lines
        assert f"acceld conductor: http://127.0.0.1:{conductor}" in lines
        assert f"acceld agent: http://127.0.0.1:{agent}" in lines
        assert requests.get(f"http://127.0.0.1:{api}/accelerator/v2", timeout=5).status_code == 200
        # /healthcheck on each service, without credentials; API and conductor check the
        # database.
        for port, body in ((api, "database OK"), (conductor, "database OK"), (agent, "")):
            health = requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=5)
            assert (health.status_code, health.text) == (200, body), port
        # The generated internal secret is private to its owner.
        secret = tmp_path / "state" / "internal.secret"
        assert secret.stat().st_mode & 0o777 == 0o600
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(port_open(p) for p in (api, conductor, agent)):
            assert time.monotonic() < deadline, "a service still listens after the stop"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_services_do_not_outlive_an_all_in_one_killed_with_sigkill(tmp_path):
    """Each service runs in a session of its own; killed with -9 (the OOM killer, a test's
    last resort), the all-in-one cannot stop them, so they stop themselves."""
    conductor, agent = free_port(), free_port()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nhost = aio-kill\n[conductor]\nport = {conductor}\n"
                    f"[agent]\nport = {agent}\nenabled_drivers = fake\n")
    launched = allinone.launch(str(tmp_path / "state"), str(conf))
    try:
        ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in
                 (launched.url, f"http://127.0.0.1:{conductor}", f"http://127.0.0.1:{agent}")]
        assert all(port_open(p) for p in ports)
        launched.proc.send_signal(signal.SIGKILL)
        launched.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(port_open(p) for p in ports):
            assert time.monotonic() < deadline, "a service outlived the all-in-one"
            time.sleep(0.1)
    finally:
        allinone.stop(launched.proc)
