"""Version skew, end to end (docs/upgrades.md): the previous release's API and agent keep
working through a rolling upgrade, against this release's conductor and schema.

The previous release is a pinned earlier commit of this repository (PREVIOUS, the last
before expand/contract and internal API versions), exported with ``git archive`` into a
temporary directory and run from there (PYTHONPATH, the same virtualenv). The test plays
the documented order: the database is made by the previous release; its API and agent
start; this release's ``acceld db upgrade --expand`` runs under them; this release's
conductor starts; an ARQ is bound through the previous release's API, on the previous
release's agent (a 1.0 hello), with a conductor of the previous release (started before
the expand) beside this release's, then with this release's alone; a second node, half through step 4, runs this release's
agent with a driver process of the previous release (a 1.0 driver hello), and an ARQ is
bound on its device; ``acceld-status upgrade check`` passes with a warning naming the agent
still to upgrade, and without one once it is upgraded (its ARQ still Bound). On SQLite,
PostgreSQL and MariaDB (the servers skipped unless configured). Skipped,
saying why, where git or the commit is not available. Bounded: every wait has a
deadline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests
from sqlalchemy import select

from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import deployables
from acceld.runtime.secrets import ensure_secret_file
from tests.helpers import ADMIN, SERVICE
from tests.support.databases import create_server_database, drop_server_database
from tests.support.chaos import AcceldProcess, HttpApi, wait_until, write_conf
from tests.support.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(60)]

PREVIOUS = "f96c44cfd869be17e74e8b996113af7b2f38ff7e"  # schema 0011, internal API 1.0
PREVIOUS_HEAD = "0011_node_key_generations"
OLD_CLI = "acceld.cli"  # the previous release's command line (acceld.cmd.main since)
REPO = Path(__file__).resolve().parents[2]
URL = "/accelerator/v2"
STATUS = Path(sys.executable).with_name("acceld-status")


def previous_release(into: Path) -> Path:
    """PREVIOUS's acceld package under ``into`` (skip, saying why, when it cannot be had)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: the previous release cannot be checked out")
    found = subprocess.run([git, "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                           capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS[:12]} (the previous release) is not in this "
                    "checkout's history (a shallow clone?)")
    into.mkdir()
    archive = subprocess.Popen([git, "-C", str(REPO), "archive", PREVIOUS, "acceld"],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True,
                   timeout=60)
    assert archive.wait(60) == 0
    return into


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def empty_db_url(request, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An empty database of its own (the previous release makes its schema)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'acceld.sqlite'}"
        return
    url = create_server_database(request.param, migrated=False)
    try:
        yield url
    finally:
        drop_server_database(request.param, url)


def test_the_previous_release_binds_through_this_conductor(tmp_path: Path,
                                                          empty_db_url: str) -> None:
    old_tree = previous_release(tmp_path / "previous")
    # Run from a directory of its own: `python -m` puts the working directory first on
    # the path, which would otherwise be this checkout.
    old_env = {**os.environ, "PYTHONPATH": str(old_tree)}
    runs = tmp_path / "run"
    runs.mkdir()
    which = subprocess.run([sys.executable, "-c", "import acceld; print(acceld.__file__)"],
                           env=old_env, cwd=runs, capture_output=True, text=True, timeout=60)
    assert which.stdout.startswith(str(old_tree)), which.stdout + which.stderr

    state = tmp_path / "state"
    ensure_secret_file(str(state))
    db_url = empty_db_url
    ports = {name: free_port() for name in ("conductor", "old-conductor", "agent", "api",
                                            "agent-2", "driver-2")}
    conductor_url = ",".join(f"http://127.0.0.1:{ports[name]}"
                             for name in ("conductor", "old-conductor"))
    sections: dict[str, dict[str, object]] = {
        "DEFAULT": {"state_path": state, "host": "skew-1"},
        "database": {"connection": db_url},
        "conductor": {"url": conductor_url, "port": ports["conductor"],
                      "bind_poll_interval": 0.2, "agent_check_interval": 0.5,
                      "member_heartbeat_interval": 0.5, "member_dead_after": 3},
        "agent": {"port": ports["agent"], "heartbeat_interval": 1, "discovery_interval": 2,
                  "enabled_drivers": "fake"},
        "api": {"port": ports["api"], "workers": 1},
    }
    conf = write_conf(tmp_path / "acceld.conf", sections)
    sections["conductor"] = {**sections["conductor"], "port": ports["old-conductor"]}
    old_conf = write_conf(tmp_path / "old-conductor.conf", sections)
    # Node skew-2: no driver in its agent, one fake QAT in a driver process.
    conf_2 = write_conf(tmp_path / "skew-2.conf", {
        "DEFAULT": {"state_path": state, "host": "skew-2"},
        "database": {"connection": db_url},
        "conductor": {"url": conductor_url},
        "agent": {"port": ports["agent-2"], "heartbeat_interval": 1,
                  "discovery_interval": 2, "enabled_drivers": ""},
        "fake_driver": {"devices": "QAT", "state_dir": tmp_path / "skew-2-fake"},
    })

    def cli(*args: str, env: dict[str, str] | None = None,
            command: str = "acceld.cmd.main") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", command, *args], env=env, cwd=runs,
                              capture_output=True, text=True, timeout=60)

    # The previous release made the database and runs its API and agent on it.
    made = cli("db", "upgrade", "--config-file", conf, env=old_env, command=OLD_CLI)
    assert made.returncode == 0 and PREVIOUS_HEAD in made.stdout, made.stdout + made.stderr
    old_api = AcceldProcess("old-api", ["api", "--config-file", conf], tmp_path,
                            ports["api"], env=old_env, cwd=runs, module=OLD_CLI)
    old_agent = AcceldProcess("old-agent", ["agent", "--config-file", conf], tmp_path,
                              ports["agent"], env=old_env, cwd=runs, module=OLD_CLI)
    old_conductor = AcceldProcess("old-conductor", ["conductor", "--config-file", old_conf],
                                  tmp_path, ports["old-conductor"], env=old_env, cwd=runs,
                                  module=OLD_CLI)
    conductor = AcceldProcess("conductor", ["conductor", "--config-file", conf], tmp_path,
                              ports["conductor"], cwd=runs)
    agent_2 = AcceldProcess("agent-2", ["agent", "--config-file", conf_2], tmp_path,
                            ports["agent-2"], cwd=runs)
    old_driver_2 = AcceldProcess(
        "old-driver-2", ["driver", "fake", "--config-file", conf_2, "--port",
                         str(ports["driver-2"]), "--agent-url",
                         f"http://127.0.0.1:{ports['agent-2']}"],
        tmp_path, ports["driver-2"], env=old_env, cwd=runs, module=OLD_CLI)
    new_agent = AcceldProcess("new-agent", ["agent", "--config-file", conf], tmp_path,
                              ports["agent"], cwd=runs)
    processes = [old_api, old_agent, old_conductor, conductor, agent_2, old_driver_2,
                 new_agent]
    api = HttpApi(f"http://127.0.0.1:{ports['api']}")
    db = Database(db_url)

    def explain() -> str:
        return "\n".join(f"---- {p.name} ----\n{p.log(3000)}" for p in processes)

    try:
        for process in (old_conductor, old_api, old_agent):
            process.launch()
        for process in (old_conductor, old_api, old_agent):
            process.wait_ready()
        # Step 1 of the upgrade, under the running services of the previous release.
        expanded = cli("db", "upgrade", "--expand", "--config-file", conf)
        assert expanded.returncode == 0, expanded.stdout + expanded.stderr
        assert migrate.current_revision(db) == migrate.head_revision() != PREVIOUS_HEAD
        # Step 2: this release's conductor beside the previous release's (the hash ring
        # shares the host between them); the agent of the previous release says hello.
        conductor.start()
        rp_uuid = wait_until(lambda: _rp_uuid(db, "skew-1"), 30,
                             "the old agent's inventory", explain)
        # Through the previous release's API, on the expanded schema: a bind.
        for name, resource in (("fpga", "FPGA"), ("qat", "CUSTOM_QAT")):
            made = api.simulate_post(f"{URL}/device_profiles", headers=ADMIN, json=[
                {"name": name, "groups": [{f"resources:{resource}": "1"}]}])
            assert made.status_code == 201, made.text
        arq = _bind(api, "fpga", "skew-1", rp_uuid, explain)
        health = requests.get(f"http://127.0.0.1:{ports['old-conductor']}/healthcheck",
                              timeout=10)
        assert health.status_code == 200, health.text + explain()  # its database is fine
        old_conductor.stop()  # step 2 done: every conductor at this release
        # This release's conductor alone now: it binds on the previous release's agent.
        arq_1b = _bind(api, "fpga", "skew-1", rp_uuid, explain)
        # Step 4 on node skew-2: its agent upgraded, its driver process not yet.
        old_driver_2.launch()
        agent_2.start()
        old_driver_2.wait_ready()
        rp_uuid_2 = wait_until(lambda: _rp_uuid(db, "skew-2"), 30,
                               "the old driver process's device, through the new agent",
                               explain)
        arq_2 = _bind(api, "qat", "skew-2", rp_uuid_2, explain)
        # The check passes in the window, with a warning naming the agent left to upgrade.
        check = _upgrade_check(conf, runs)
        flat = " ".join(part.strip(" |") for part in check.stdout.splitlines())
        assert check.returncode == 1, check.stdout + check.stderr
        assert "1 agent(s) at" in flat and "still at the previous release" in flat, flat
        assert "skew-1" in flat and "skew-2" not in flat, flat
        assert "(internal API 1.0)" in flat, flat
        assert "Result: Failure" not in flat, flat
        assert all(p.proc.poll() is None for p in (old_api, old_agent, old_driver_2)), \
            explain()
        # skew-1's agent upgraded: its ARQ stays Bound, and nothing is left to warn of.
        old_agent.stop()
        new_agent.start()
        last: list[subprocess.CompletedProcess] = []

        def passes() -> bool:  # once the upgraded agent is up and answers 1.1
            last[:] = [_upgrade_check(conf, runs)]
            return last[0].returncode == 0

        wait_until(passes, 30, "the upgrade check to pass after step 4",
                   lambda: last[0].stdout + explain() if last else explain())
        for bound in (arq, arq_1b, arq_2):
            got = api.simulate_get(f"{URL}/accelerator_requests/{bound['uuid']}",
                                   headers=ADMIN)
            assert got.json["state"] == "Bound", got.text
    finally:
        api.close()
        for process in processes:
            process.stop()
        db.dispose()


def _rp_uuid(db: Database, host: str) -> str | None:
    with db.read() as conn:
        return conn.execute(select(deployables.c.rp_uuid).where(
            deployables.c.name.startswith(f"{host}_", autoescape=True))).scalars().first()


def _bind(api: HttpApi, profile: str, host: str, rp_uuid: str, explain) -> dict:  # type: ignore[no-untyped-def]
    """An ARQ of ``profile`` bound to ``rp_uuid`` on ``host`` (as Nova asks), once Bound."""
    created = api.simulate_post(f"{URL}/accelerator_requests", headers=ADMIN,
                                json={"device_profile_name": profile})
    assert created.status_code == 201, created.text
    (arq,) = created.json["arqs"]
    patched = api.simulate_patch(f"{URL}/accelerator_requests", headers=SERVICE, json={
        arq["uuid"]: [{"op": "add", "path": "/hostname", "value": host},
                      {"op": "add", "path": "/device_rp_uuid", "value": rp_uuid},
                      {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]})
    assert patched.status_code == 202, patched.text

    def state() -> str | None:
        got = api.simulate_get(f"{URL}/accelerator_requests/{arq['uuid']}", headers=ADMIN)
        assert got.status_code == 200, got.text
        return got.json["state"] if got.json["state"] in ("Bound", "BindFailed") else None

    assert wait_until(state, 30, f"the bind on {host}", explain) == "Bound", explain()
    return arq


def _upgrade_check(conf: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(STATUS), "--config-file", conf, "upgrade", "check"],
                          cwd=cwd, capture_output=True, text=True, timeout=60)

