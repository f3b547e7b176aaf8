"""`acceld-status upgrade check` (oslo.upgradecheck): the console script on a fresh and an
old database, and each check's findings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from oslo_config import cfg
from oslo_upgradecheck.upgradecheck import Code

from acceld import config
from acceld.agent.service import Agent
from acceld.cmd import agents_check
from acceld.cmd.agents_check import check_agents
from acceld.cmd.placement_check import check_placement
from acceld.cmd.policy_check import check_policy
from acceld.db import agents as agents_db
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.internal.server import respond, serve
from acceld.runtime.secrets import ensure_secret_file
from tests.conftest import make_conf
from tests.support.net import free_port
from tests.support.releases import CONTRACT_DROP, EXPAND_WIDGETS, later_release, write_release

RECORDED = Path(__file__).parents[1] / "fixtures" / "internal_api_1.0"

STATUS = Path(sys.executable).with_name("acceld-status")


def _status(conf_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(STATUS), "--config-file", str(conf_file), "upgrade", "check"],
                          capture_output=True, text=True, timeout=120)


def _state(tmp_path: Path, revision: str | None) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if revision:
        db = Database(f"sqlite:///{state / 'acceld.sqlite'}")
        migrate.upgrade(db, revision)
        db.dispose()
    conf_file = tmp_path / "acceld.conf"
    conf_file.write_text(f"[DEFAULT]\nstate_path = {state}\n")
    return conf_file


def test_passes_on_a_fresh_database(tmp_path: Path) -> None:
    done = _status(_state(tmp_path, "head"))
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("Database schema", "Policy file", "Placement API", "Agent versions",
                  "Bound accelerator requests"):
        assert f"Check: {check}" in done.stdout
    assert done.stdout.count("Result: Success") == 5
    assert f"At revision {migrate.head_revision()}." in done.stdout


def test_fails_clearly_on_an_old_database(tmp_path: Path) -> None:
    done = _status(_state(tmp_path, "0001"))
    assert done.returncode == 2, done.stdout + done.stderr
    flat = " ".join(part.strip(" |") for part in done.stdout.splitlines())
    assert "Result: Failure" in flat
    assert "The database schema is at revision 0001, not" in flat
    assert "run `acceld db upgrade`" in flat
    assert "Traceback" not in done.stdout + done.stderr


def test_fails_naming_bound_arqs_without_a_handle(tmp_path: Path) -> None:
    # The damage of 0005 on SQLite before issue 24's fix: a Bound ARQ whose handle is gone.
    conf_file = _state(tmp_path, "head")
    db = Database(f"sqlite:///{tmp_path / 'state' / 'acceld.sqlite'}")
    with db.write() as conn:
        conn.exec_driver_sql(
            "INSERT INTO device_profiles (id, uuid, name, profile_json, created_at) "
            "VALUES (1, 'dp-1', 'gpu', '{}', '2026-12-01 00:00:00')")
        conn.exec_driver_sql(
            "INSERT INTO accelerator_requests (id, uuid, state, device_profile_id, "
            "device_profile_group_id, hostname, device_rp_uuid, instance_uuid, created_at) "
            "VALUES (1, 'arq-1', 'Bound', 1, 0, 'node1', 'rp-1', 'inst-1', "
            "'2026-12-01 00:00:00')")
    db.dispose()
    done = _status(conf_file)
    assert done.returncode == 2, done.stdout + done.stderr
    flat = " ".join(part.strip(" |") for part in done.stdout.splitlines())
    assert ("ARQ arq-1 (instance inst-1, host node1, provider rp-1): no attach handle"
            in flat)
    assert "Traceback" not in done.stdout + done.stderr


def _policy_conf(tmp_path: Path, text: str | None) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.load(conf=conf)
    if text is not None:
        path = tmp_path / "policy.yaml"
        path.write_text(text)
        conf.set_override("policy_file", str(path), group="oslo_policy")
    else:
        conf.set_override("policy_file", str(tmp_path / "absent.yaml"), group="oslo_policy")
    return conf


@pytest.mark.parametrize("text, code, says", [
    (None, Code.SUCCESS, "every rule has its default"),
    ('"cyborg:device:get_all": "role:reader"\n', Code.SUCCESS, "no deprecated rule in use"),
    ('"cyborg:device:get_all": [unclosed\n', Code.FAILURE, "cannot be read"),
    ('"cyborg:device:get_all": "rule:no_such_rule"\n', Code.FAILURE, "undefined rule"),
    ('"is_admin": "role:admin"\n', Code.WARNING, "'is_admin' is deprecated for removal"),
    ('"cyborg:arq:create": "rule:admin_or_owner"\n', Code.WARNING,
     "'cyborg:arq:create' refers to deprecated 'admin_or_owner'"),
    ('"cyborg:device:get_all": "rule:admin_api"\n', Code.WARNING,
     "'cyborg:device:get_all' sets its deprecated default 'rule:admin_api'"),
    ('"cyborg:nothing": "@"\n', Code.WARNING, "'cyborg:nothing' is not an acceld rule"),
])
def test_policy_findings(tmp_path: Path, text: str | None, code: Code, says: str) -> None:
    result = check_policy(_policy_conf(tmp_path, text))
    assert result.code == code, result.details
    assert says in result.details


def test_placement_not_configured_is_fine(tmp_path: Path) -> None:
    assert check_placement(make_conf(str(tmp_path))).code == Code.SUCCESS


def test_placement_unreachable_fails(tmp_path: Path) -> None:
    from keystoneauth1 import loading as ks_loading

    conf = make_conf(str(tmp_path))
    conf.register_opts(ks_loading.get_auth_plugin_conf_options("admin_token"),
                       group="placement")
    conf.set_override("auth_type", "admin_token", group="placement")
    conf.set_override("endpoint", f"http://127.0.0.1:{free_port()}", group="placement")
    conf.set_override("token", "admin", group="placement")
    conf.set_override("timeout", 5, group="placement")
    result = check_placement(conf)
    assert result.code == Code.FAILURE
    assert result.details.startswith("Placement cannot be reached:")


@pytest.fixture
def agent_setup(tmp_path, sqlite_db):  # type: ignore[no-untyped-def]
    ensure_secret_file(str(tmp_path))
    conf = make_conf(str(tmp_path), agent__port=0, agent__heartbeat_interval=3600,
                     conductor__url=[f"http://127.0.0.1:{free_port()}"])
    conf.set_override("connection", str(sqlite_db.url), group="database")
    # The agent's own server and routes (GET /version among them), without its hello loop.
    agent = Agent(conf, "node1", drivers=[FakeDriver(conf, "node1")])
    agent.server = serve(conf, agent.keys, agent.routes(), "127.0.0.1", 0,
                         destination=auth.agent_destination("node1"))
    with sqlite_db.write() as conn:
        agents_db.record_heartbeat(conn, "node1", f"127.0.0.1:{agent.server.port}", 3600)
    yield conf, sqlite_db
    agent.server.stop()


def test_agents_at_this_version_pass_and_an_older_release_is_the_window(
        agent_setup, monkeypatch) -> None:
    conf, db = agent_setup
    result = check_agents(conf)
    assert (result.code, result.details) == (
        Code.SUCCESS, f"All 1 agent(s) run acceld {agents_check.VERSION} or newer.")
    monkeypatch.setattr(agents_check, "VERSION", "999.0")  # this side upgraded first
    result = check_agents(conf)
    assert result.code == Code.WARNING  # it speaks this internal API: served
    assert "still at the previous release, served during the rolling upgrade: node1 (" \
        in result.details
    assert "what remains: upgrade acceld-agent" in result.details


def _agent_answering(conf, db, tmp_path, answer) -> Any:  # type: ignore[no-untyped-def]
    """An agent (node2) whose GET /version answers ``answer`` (a dict; None: no route,
    as before the route existed)."""
    keys = Agent(conf, "node2", drivers=[]).keys

    def on_version(req, resp) -> None:  # type: ignore[no-untyped-def]
        respond(resp, answer)

    server = serve(conf, keys, {"/version": {"GET": on_version}} if answer else {},
                   "127.0.0.1", 0, destination=auth.agent_destination("node2"))
    with db.write() as conn:
        agents_db.record_heartbeat(conn, "node2", f"127.0.0.1:{server.port}", 3600)
    return server


def test_an_agent_of_the_previous_release_is_a_warning_saying_what_remains(
        agent_setup, tmp_path) -> None:
    conf, db = agent_setup
    answer = json.loads((RECORDED / "agent_version.json").read_text())  # 1.0's answer
    server = _agent_answering(conf, db, tmp_path, answer)
    try:
        result = check_agents(conf)
    finally:
        server.stop()
    assert result.code == Code.WARNING, result.details
    assert result.details.startswith(f"1 agent(s) at {agents_check.VERSION} or newer; "
                                     "still at the previous release, served during the "
                                     f"rolling upgrade: node2 ({answer['version']} "
                                     "(internal API 1.0)); what remains:")
    assert "`acceld db upgrade --contract`" in result.details


@pytest.mark.parametrize("answer, says", [
    (None, "node2 ((before GET /version))"),
    ({"version": "0.1.0", "api_version": "0.9"}, "node2 (0.1.0 (internal API 0.9))"),
    ({"version": "0.1.0", "api_version": "2.0"}, "node2 (0.1.0 (internal API 2.0))"),
])
def test_an_agent_this_release_does_not_serve_fails(agent_setup, tmp_path, answer,
                                                     says) -> None:
    conf, db = agent_setup
    server = _agent_answering(conf, db, tmp_path, answer)
    try:
        result = check_agents(conf)
    finally:
        server.stop()
    assert result.code == Code.FAILURE, result.details
    assert result.details.startswith("Agents older than the previous release, which this "
                                     f"acceld {agents_check.VERSION} (internal API 1.0 to "
                                     "1.1) does not serve: ")
    assert says in result.details


def _schema_result(db: Database, monkeypatch) -> Any:  # type: ignore[no-untyped-def]
    from acceld.cmd import status

    monkeypatch.setattr(status, "_database", lambda: db)
    return status.Checks()._check_schema()


def test_the_schema_check_in_the_window(tmp_path, monkeypatch) -> None:
    db = Database(f"sqlite:///{tmp_path / 'window.sqlite'}")
    later = write_release(tmp_path, [EXPAND_WIDGETS, CONTRACT_DROP])
    with later_release(later):  # the later release's controller, expand done
        migrate.upgrade(db, phase=migrate.EXPAND)
        result = _schema_result(db, monkeypatch)
        assert result.code == Code.WARNING, result.details
        assert result.details == (
            "Expanded; contract migration(s) left: 9002_contract. Run `acceld db upgrade "
            "--contract` once every service (agents and driver processes included) runs "
            "this release.")
    result = _schema_result(db, monkeypatch)  # this release's code on that schema
    assert result.code == Code.WARNING and "ahead of this release" in result.details
    with later_release(later):
        migrate.upgrade(db, phase=migrate.CONTRACT)
        assert _schema_result(db, monkeypatch).code == Code.SUCCESS
    result = _schema_result(db, monkeypatch)  # contracted: this release cannot run
    assert result.code == Code.FAILURE and "contracted by a newer release" in result.details
    db.dispose()


def test_an_agent_not_answering_is_a_warning(agent_setup) -> None:
    conf, db = agent_setup
    with db.write() as conn:
        agents_db.record_heartbeat(conn, "node2", f"127.0.0.1:{free_port()}", 3600)
    result = check_agents(conf)
    assert result.code == Code.WARNING
    assert "not answering: node2 (ConnectionError)" in result.details


def test_upstreams_transition_policy_is_one_summarised_warning(tmp_path: Path) -> None:
    """Issue 40: with upstream's `[oslo_policy] enforce_new_defaults = False` (and its
    policy.yaml) the check printed oslo.policy's deprecation warning once per rule (17
    UserWarnings on stderr). Now the policy check says it once: how many rules keep their
    deprecated default, which, and what to do; stderr carries none of them."""
    conf_file = _state(tmp_path, "head")
    policy = tmp_path / "policy.yaml"
    policy.write_text((Path(__file__).parents[1] / "support" / "upstream_conf" /
                       "policy.yaml").read_text())
    conf_file.write_text(conf_file.read_text() + "[oslo_policy]\nenforce_new_defaults = False\n"
                         f"policy_file = {policy}\n")
    done = _status(conf_file)
    assert "deprecated" not in done.stderr, done.stderr
    assert done.stdout.count("enforce_new_defaults") == 1, done.stdout
    assert done.returncode == 1, done.stdout  # a warning: the check's exit status 1
    details = " ".join(done.stdout.split("Check: Policy file")[1].split("Check:")[0]
                       .replace("|", " ").split())
    assert "Result: Warning" in details
    assert "rule(s) keep their deprecated default" in details
    assert "'cyborg:arq:delete'" in details and "'admin_or_owner'" in details
