"""`acceld simulate` against a real `acceld conductor`: registration, steady state, churn."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from acceld.db.engine import Database
from acceld.db.models import agents, devices, internal_nonces
from acceld.runtime.secrets import ensure_secret_file

pytestmark = pytest.mark.integration

ACCELD = [sys.executable, "-m", "acceld.cmd.main"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def conductor(tmp_path):
    port = _free_port()
    db_url = f"sqlite:///{tmp_path / 'acceld.sqlite'}"
    conf = tmp_path / "sim.conf"
    conf.write_text(f"[database]\nconnection = {db_url}\n[conductor]\nport = {port}\n")
    common = ["--config-file", str(conf), "--state-path", str(tmp_path)]
    ensure_secret_file(str(tmp_path))
    subprocess.run([*ACCELD, "db", "upgrade", *common], check=True, capture_output=True)
    proc = subprocess.Popen([*ACCELD, "conductor", *common], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "conductor did not start"
            time.sleep(0.05)
    yield common, Database(db_url)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)


def _run(common: list[str], *args: str) -> tuple[int, dict[str, dict]]:
    done = subprocess.run([*ACCELD, "simulate", *common, *args], capture_output=True,
                          text=True, timeout=120)
    events = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            events[event["event"]] = event
    return done.returncode, events


def test_agents_register_heartbeat_and_changes_are_pulled(conductor) -> None:
    common, db = conductor
    rc, events = _run(common, "--agents", "6", "--devices-per-agent", "3",
                      "--heartbeat-interval", "1", "--steady-seconds", "2.5",
                      "--churn-seconds", "2", "--change-every", "1", "--change-percent", "20")
    assert rc == 0, events
    assert events["registered"]["agents"] == 6
    assert events["registered"]["pulls"] == 6  # each node pulled once on its first hello
    # Steady state: heartbeats, and no pull at all (the digest did not change).
    assert events["steady_end"]["hellos"] >= 6
    assert events["steady_end"]["pulls"] == 0
    assert events["steady_end"]["refused"] == 0
    # Churn: every changed device made its node be pulled again.
    changed = events["churn_end"]["devices_changed"]
    assert changed >= 4
    assert events["churn_end"]["pulls"] >= 1
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(devices)).scalar_one() == 18
        assert conn.execute(select(func.count()).select_from(agents)).scalar_one() == 6
        revised = conn.execute(select(func.count()).select_from(devices).where(
            devices.c.model.like("simulated model rev %"))).scalar_one()
    assert revised >= 1
    # Hellos are signed for the conductor process's own name once it announced it: only
    # those sent before its first answer (one per kept-alive connection at most) used the
    # shared name and its nonce table.
    with db.read() as conn:
        shared = conn.execute(select(func.count()).select_from(internal_nonces)).scalar_one()
    assert 1 <= shared <= 8 < events["churn_end"]["hellos"]


def test_a_wrong_secret_is_refused(conductor, tmp_path) -> None:
    common, db = conductor
    other = tmp_path / "other"
    other.mkdir()
    (other / "internal.secret").write_text("not-the-conductors-secret-0123456789")
    conf = common[1]
    rc, events = _run(["--config-file", conf, "--state-path", str(other)], "--agents", "2",
                      "--devices-per-agent", "1", "--register-timeout", "3")
    assert rc == 1
    assert "failed" in events and "401" in events["failed"]["last_error"]
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(agents)).scalar_one() == 0
