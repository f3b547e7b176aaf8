"""The WSGI recipes in etc/: the mod_wsgi script loads acceld.wsgi.api with the
configuration it names, the vhost serves that script in one interpreter per process and
avoids SetEnv (which never reaches os.environ), and the uwsgi ini avoids `env =` (which
never reaches pyuwsgi's Python). The uwsgi ini is served for real in
tests/integration/test_uwsgi.py."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from acceld.db import migrate
from acceld.db.engine import Database

REPO = Path(__file__).resolve().parents[2]
WSGI_SCRIPT = REPO / "etc" / "apache2" / "acceld-api.wsgi"
VHOST = REPO / "etc" / "apache2" / "acceld-api.conf"
UWSGI_INI = REPO / "etc" / "uwsgi" / "acceld-api.ini"

LOAD = ("import runpy, sys; ns = runpy.run_path(sys.argv[1]); "
        "print(type(ns['application']).__name__)")


def _run_script(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD, str(WSGI_SCRIPT)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_mod_wsgi_script_loads_the_application(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    db = Database(f"sqlite:///{state}/acceld.sqlite")
    migrate.upgrade(db)
    db.dispose()
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nstate_path = {state}\n[api]\nallow_insecure_noauth = true\n")
    env = {**os.environ, "OS_ACCELD_CONFIG_FILES": str(conf), "HOME": str(tmp_path)}
    done = _run_script(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "LazyApplication"


def test_the_mod_wsgi_script_defaults_to_the_standard_file(tmp_path):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("OS_ACCELD_")}
    env["HOME"] = str(tmp_path)
    if Path("/etc/acceld/acceld.conf").exists():
        pytest.skip("acceld is installed here: /etc/acceld/acceld.conf exists")
    done = _run_script(env)
    assert done.returncode != 0
    assert "OS_ACCELD_CONFIG_FILES names '/etc/acceld/acceld.conf', which is not a file" \
        in done.stderr


def test_the_vhost_serves_the_script_in_one_interpreter():
    text = VHOST.read_text()
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.strip().startswith("#")]
    (alias,) = [line for line in lines if line.startswith("WSGIScriptAlias ")]
    target = alias.split()[2]
    assert f"etc/apache2/{WSGI_SCRIPT.name} {target}" in text  # the install line names it
    assert "WSGIApplicationGroup %{GLOBAL}" in lines
    assert any(line.startswith("WSGIDaemonProcess acceld-api ") for line in lines)
    assert "WSGIProcessGroup acceld-api" in lines
    assert not [line for line in lines if line.startswith("SetEnv OS_ACCELD")]


def test_the_uwsgi_ini_loads_the_application_in_a_master():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(UWSGI_INI)
    ini = parser["uwsgi"]
    assert ini["module"] == "acceld.wsgi.api:application"
    assert "env" not in ini
    assert (ini["master"], ini["enable-threads"], ini["lazy-apps"], ini["need-app"]) == (
        "true", "true", "false", "true")
    # The port is the API's ([api] port's default), as `acceld api` listens.
    assert re.fullmatch(r"0\.0\.0\.0:6666", ini["http-socket"])
