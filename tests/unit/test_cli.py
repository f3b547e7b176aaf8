"""The `acceld` command's admin subcommands: config and policy samples, db upgrade."""

import os
import subprocess
import sys

import pytest
from oslo_config import cfg

from acceld import cli, config
from acceld.db import migrate
from acceld.db.engine import Database


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cli", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_config_sample_lists_every_option(capsys):
    assert cli.main(["config", "sample"]) == 0
    sample = capsys.readouterr().out
    for group, opts in config.list_opts():
        assert f"[{group}]" in sample
        for opt in opts:
            assert f"#{opt.dest} = " in sample, (group, opt.dest)
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
