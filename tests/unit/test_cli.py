"""The `acceld` command's admin subcommands: config and policy samples, db upgrade."""

import os
import subprocess
import sys

import pytest
from oslo_config import cfg

from acceld import config
from acceld.cmd import main as cli
from acceld.conf import opts as opts_list
from acceld.db import migrate
from acceld.db.engine import Database


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_config_sample_lists_every_option(capsys):
    assert cli.main(["config", "sample"]) == 0
    sample = capsys.readouterr().out
    for group, opts in opts_list.list_opts():
        assert f"[{getattr(group, 'name', group)}]" in sample
        for opt in opts:
            assert f"\n#{opt.dest} =" in sample, (group, opt.dest)
    assert "[keystone_authtoken]" in sample


def test_config_sample_is_a_valid_config(tmp_path, capsys):
    cli.main(["config", "sample"])
    path = tmp_path / "acceld.conf"
    # Uncommenting the defaults must give back the defaults.
    lines = [line[1:] if line.startswith("#") and " = " in line and not line.startswith("# ")
             else line for line in capsys.readouterr().out.splitlines()]
    path.write_text("\n".join(line for line in lines if "<None>" not in line
                              and "<hostname>" not in line) + "\n")
    conf = cfg.ConfigOpts()
    config.load(config_files=[str(path)], conf=conf)
    assert conf.api.port == 6666
    assert conf.agent.enabled_drivers == ["fake", "pci"]


def test_policy_sample_names_every_rule(capsys):
    from acceld.api.policy import RULES

    assert cli.main(["policy", "sample"]) == 0
    sample = capsys.readouterr().out
    for rule in RULES:
        assert f'"{rule.name}"' in sample


def test_environment_overrides_config(tmp_path, monkeypatch):
    conf_file = tmp_path / "acceld.conf"
    conf_file.write_text("[api]\nport = 7000\nworkers = 3\n")
    monkeypatch.setenv("OS_API__PORT", "7777")
    conf = config.load(config_files=[str(conf_file)], conf=cfg.ConfigOpts())
    assert conf.api.port == 7777  # the environment wins over the file
    assert conf.api.workers == 3


def test_db_upgrade_is_idempotent(tmp_path):
    state = str(tmp_path / "state")
    for _ in range(2):
        result = run_cli("db", "upgrade", "--state-path", state)
        assert result.returncode == 0, result.stderr
        assert f"database at revision {migrate.head_revision()}" in result.stdout
    db = Database(f"sqlite:///{state}/acceld.sqlite")
    assert migrate.current_revision(db) == migrate.head_revision()


def test_db_upgrade_from_environment_url(tmp_path):
    url = f"sqlite:///{tmp_path}/env.sqlite"
    result = run_cli("db", "upgrade", env={"OS_DATABASE__CONNECTION": url})
    assert result.returncode == 0, result.stderr
    assert migrate.current_revision(Database(url)) == migrate.head_revision()


def test_unknown_subcommand_fails_clearly():
    result = run_cli("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.parametrize("args", [["conductor", "--help"], ["agent", "--help"],
                                  ["driver", "--help"], ["status", "--help"],
                                  ["all", "--help"], ["api", "--help"]])
def test_service_commands_exist(args):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 0


def test_host_delete_retires_a_host(tmp_path):
    """`acceld host delete`: refused while the agent is up, forced or once down it removes
    the host; an unknown host says so. Exit statuses 1 (refused), 0 (done), 2 (unknown)."""
    import datetime as dt

    from sqlalchemy import func, insert, select, update

    from acceld.db.models import agents, devices, placement_sync, utcnow
    from tests.support.inventory import add_attach_handles, add_deployable, add_device

    state = str(tmp_path / "state")
    assert run_cli("db", "upgrade", "--state-path", state).returncode == 0
    db = Database(f"sqlite:///{state}/acceld.sqlite")
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname="cn-7", endpoint="cn-7:6668", state="up",
                                           heartbeat_interval=10,
                                           last_seen_at=utcnow() - dt.timedelta(seconds=5)))
        for host in ("cn-7", "cn-8"):
            dev = add_device(conn, hostname=host)
            add_attach_handles(conn, add_deployable(conn, dev["id"], name=f"{host}_x")["id"], 3)

    refused = run_cli("host", "delete", "cn-7", "--state-path", state)
    assert refused.returncode == 1
    assert "The agent of host cn-7 is up" in refused.stderr and "force" in refused.stderr

    with db.write() as conn:
        conn.execute(update(agents).values(state="down"))
    done = run_cli("host", "delete", "cn-7", "--state-path", state)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Host cn-7 retired: agent record, 1 device(s), "
                                  "1 deployable(s), 3 attach handle(s) and 0 queued "
                                  "release(s) removed.\n1 Placement provider(s)"), done.stdout
    with db.read() as conn:
        assert conn.scalars(select(devices.c.hostname)).all() == ["cn-8"]
        assert conn.execute(select(func.count()).select_from(agents)).scalar_one() == 0
        assert conn.scalars(select(placement_sync.c.hostname).where(
            placement_sync.c.dirty.is_(True))).all() == ["cn-7"]

    with db.write() as conn:
        conn.execute(placement_sync.delete())
    unknown = run_cli("host", "delete", "cn-7", "--state-path", state)
    assert unknown.returncode == 2 and "Host cn-7 is unknown" in unknown.stderr
    forced = run_cli("host", "delete", "cn-8", "--force", "--state-path", state)
    assert forced.returncode == 0 and "Host cn-8 retired: 1 device(s)" in forced.stdout
    db.dispose()


def test_api_refuses_an_old_schema(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = Database(f"sqlite:///{state / 'acceld.sqlite'}")
    migrate.upgrade(db, "0001")
    db.dispose()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nstate_path = {state}\n")
    done = run_cli("api", "--config-file", str(conf))
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        f"acceld api: The database schema is at revision 0001, not "
        f"{migrate.head_revision()}: run `acceld db upgrade`.")


def test_config_found_in_the_standard_places(tmp_path, monkeypatch):
    """No --config-file: oslo.config's search (~/.acceld/acceld.conf, ...) and the
    acceld.conf.d directory beside it; --config-file or --config-dir replace the search."""
    home = tmp_path / "home"
    (home / ".acceld" / "acceld.conf.d").mkdir(parents=True)
    (home / ".acceld" / "acceld.conf").write_text("[api]\nport = 7101\nworkers = 5\n")
    (home / ".acceld" / "acceld.conf.d" / "10-port.conf").write_text("[api]\nport = 7102\n")
    monkeypatch.setenv("HOME", str(home))
    args = cli.build_parser().parse_args(["conductor"])
    conf = config.load(config_files=args.config_file, config_dirs=args.config_dir,
                       discover=True, conf=cfg.ConfigOpts())
    assert conf.config_file == [str(home / ".acceld" / "acceld.conf")]
    assert (conf.api.port, conf.api.workers) == (7102, 5)  # the directory comes after

    given = tmp_path / "given.conf"
    given.write_text("[api]\nport = 7200\n")
    other_dir = tmp_path / "d"
    other_dir.mkdir()
    (other_dir / "x.conf").write_text("[api]\nworkers = 7\n")
    args = cli.build_parser().parse_args(
        ["conductor", "--config-file", str(given), "--config-dir", str(other_dir)])
    conf = config.load(config_files=args.config_file, config_dirs=args.config_dir,
                       discover=True, conf=cfg.ConfigOpts())
    assert (conf.api.port, conf.api.workers) == (7200, 7)


def test_no_config_anywhere_keeps_the_built_in_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    conf = config.load(discover=True, conf=cfg.ConfigOpts())
    if conf.config_file:  # this machine has /etc/acceld/acceld.conf: not a clean check
        pytest.skip(f"found {conf.config_file}")
    assert conf.api.port == 6666 and conf.database.connection is None


def test_status_without_a_database_says_so_in_one_line(tmp_path):
    done = run_cli("status", "--state-path", str(tmp_path), env={
        "OS_DATABASE__CONNECTION": "postgresql+psycopg://acceld@127.0.0.1:1/acceld"})
    assert done.returncode == 3  # distinct from 1, "an agent is down"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("acceld status: cannot reach the database: ")
    assert "127.0.0.1" in lines[0] and done.stdout == ""


def test_status_on_an_old_schema_says_so_in_one_line(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db, "0001")
    db.dispose()
    done = run_cli("status", "--state-path", str(tmp_path))
    assert done.returncode == 4
    assert done.stderr.strip() == (
        f"acceld status: The database schema is at revision 0001, not "
        f"{migrate.head_revision()}: run `acceld db upgrade`.")


def test_status_names_bound_arqs_that_hold_no_device(tmp_path):
    """A database damaged by 0005's old SQLite rebuild (a Bound ARQ whose handle was
    deleted): `acceld status` lists the ARQ with its instance and host, and exits 5."""
    from sqlalchemy import insert

    from acceld.db.models import accelerator_requests, device_profiles

    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db)
    with db.write() as conn:
        conn.execute(insert(device_profiles).values(
            id=1, uuid="dp-1", name="gpu", profile_json="{}"))
        conn.execute(insert(accelerator_requests).values(
            uuid="arq-1", state="Bound", device_profile_id=1, device_profile_group_id=0,
            project_id="p1", hostname="node1", device_rp_uuid="rp-1",
            instance_uuid="inst-1", attach_handle_id=None, deployable_id=None))
    db.dispose()
    done = run_cli("status", "--state-path", str(tmp_path))
    assert done.returncode == 5, done.stderr
    line = next(li for li in done.stdout.splitlines() if "arq-1" in li)
    assert line.split() == ["node1", "arq-1", "inst-1", "no", "attach", "handle"]
    assert "Bound accelerator requests that hold no device" in done.stdout
