"""What ``acceld api``'s master and worker load, as the worker's RSS counts every page it
maps, those it shares with the master since the fork included (issue 26's memory goal):
never alembic (the master's schema check runs in a child, acceld.services.schema_gate),
oslo.privsep (the agent's) nor the simulator; keystonemiddleware only when auth_strategy
is keystone (acceld.api.auth). The master's objects are frozen before the fork, so the
worker's garbage collections do not copy their pages (acceld.services.api_server).

Real processes on loopback, SQLite. gunicorn's own hooks, added to acceld's for this
test only, write each process's ``sys.modules`` once the master is ready and once the
worker has loaded the application."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_agents import Process, write_conf
from tests.support.net import free_port

pytestmark = pytest.mark.integration

RECORDING = """
import gc, json, sys
from acceld.metrics import serve

prefix, real = sys.argv[1], serve.api_master_hooks


def hooks(conf):
    found = dict(real(conf))
    ready, init = found.get("when_ready"), found.get("post_worker_init")

    def when_ready(arbiter):
        if ready:
            ready(arbiter)
        with open(prefix + "master.json", "w") as out:
            json.dump(sorted(sys.modules), out)

    def post_worker_init(worker):
        if init:
            init(worker)
        with open(prefix + "frozen", "w") as out:
            out.write(str(gc.get_freeze_count()))
        with open(prefix + "worker.json", "w") as out:
            json.dump(sorted(sys.modules), out)

    found.update(when_ready=when_ready, post_worker_init=post_worker_init)
    return found


serve.api_master_hooks = hooks
from acceld.cmd.main import main
sys.exit(main(sys.argv[2:]))
"""

NEVER = ("alembic", "mako", "oslo_privsep", "acceld.privileged", "acceld.cmd.simulator",
         "acceld.db.migrations")


def _loaded(tmp_path: Path, auth_strategy: str) -> tuple[set[str], set[str], int]:
    """The modules of ``acceld api``'s master and of its worker, and how many objects the
    worker found frozen (gc.freeze) when it started."""
    state = tmp_path / "state"
    port = free_port()
    conf = write_conf(tmp_path / "api.conf", {
        "DEFAULT": {"state_path": state, "auth_strategy": auth_strategy},
        "api": {"port": port, "workers": 1},
    })
    subprocess.run([sys.executable, "-m", "acceld.cmd.main", "db", "upgrade", "--config-file", conf],
                   check=True, capture_output=True, timeout=120)
    prefix = str(tmp_path / "modules-")
    proc = Process("api", ["api", "--config-file", conf], tmp_path, port)
    proc.argv = [sys.executable, "-c", RECORDING, prefix, *proc.argv[3:]]
    try:
        proc.start()
        deadline = time.monotonic() + 60
        files = [Path(prefix + "master.json"), Path(prefix + "worker.json")]
        while not all(f.exists() and f.stat().st_size for f in files):
            assert time.monotonic() < deadline, f"no module lists:\n{proc.log()}"
            time.sleep(0.1)
        time.sleep(0.2)  # the worker's file, written whole
        master, worker = (set(json.loads(f.read_text())) for f in files)
        frozen = int(Path(prefix + "frozen").read_text())
    finally:
        proc.stop()
    return master, worker, frozen


def _any(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_the_noauth_api_loads_no_migration_privsep_simulator_or_keystone(tmp_path):
    master, worker, _ = _loaded(tmp_path, "noauth")
    assert "acceld.api.app" in worker and "sqlalchemy" in master  # the lists are real
    assert _any(master | worker, NEVER + ("keystonemiddleware",)) == []


def test_the_worker_starts_with_the_master_s_objects_frozen(tmp_path):
    # Its collections leave them, and the pages they share with the master, untouched.
    *_, frozen = _loaded(tmp_path, "noauth")
    assert frozen > 50_000  # ~95,000


def test_keystone_auth_still_loads_keystonemiddleware_in_the_worker(tmp_path):
    master, worker, _ = _loaded(tmp_path, "keystone")
    assert "keystonemiddleware.auth_token" in worker
    assert _any(master | worker, NEVER) == []
