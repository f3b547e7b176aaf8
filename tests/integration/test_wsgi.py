"""acceld.wsgi.api:application under a plain gunicorn command line, configured from the
environment (OS_ACCELD_CONFIG_FILES), as a deployment that runs its own WSGI server
does; and its refusals: of a database behind this code's schema, and of noauth (the
default) unless [api] allow_insecure_noauth says so, as the server's listen address is
not the application's to see (issue 25, item 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from acceld.db import migrate
from acceld.db.engine import Database
from tests.support.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BIN = Path(sys.executable).parent


def _config(tmp_path: Path, api: str = "allow_insecure_noauth = true\n",
            default: str = "", extra: str = "") -> Path:
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nstate_path = {tmp_path / 'state'}\n{default}"
                    f"[api]\n{api}"
                    "[oslo_middleware]\nenable_proxy_headers_parsing = true\n" + extra)
    return conf


def _gunicorn(tmp_path: Path, conf: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OS_ACCELD_CONFIG_FILES": str(conf), "HOME": str(tmp_path)}
    log = open(tmp_path / "gunicorn.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "1",
         "acceld.wsgi.api:application"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_plain_gunicorn_serves_the_wsgi_application(tmp_path: Path) -> None:
    conf = _config(tmp_path)
    subprocess.run([str(BIN / "acceld"), "db", "upgrade", "--config-file", str(conf)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    proc = _gunicorn(tmp_path, conf, port)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
            try:
                # The worker builds the app on its first request: slow on a busy machine.
                health = requests.get(base + "/healthcheck", timeout=30)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)
        assert (health.status_code, health.text) == (200, "database OK")
        listed = requests.get(base + "/accelerator/v2/device_profiles", timeout=30)
        assert listed.status_code == 200 and listed.json() == {"device_profiles": []}
        # Behind a TLS-terminating proxy ([oslo_middleware] enable_proxy_headers_parsing).
        root = requests.get(base + "/accelerator/v2", timeout=30,
                            headers={"X-Forwarded-Proto": "https"})
        assert root.json()["links"][0]["href"] == f"https://127.0.0.1:{port}/accelerator/v2/"
    finally:
        _stop(proc)


def test_wsgi_application_refuses_an_old_schema(tmp_path: Path) -> None:
    conf = _config(tmp_path)
    (tmp_path / "state").mkdir(mode=0o700)
    db = Database(f"sqlite:///{tmp_path / 'state' / 'acceld.sqlite'}")
    migrate.upgrade(db, "0001")
    db.dispose()
    proc = _gunicorn(tmp_path, conf, free_port())
    try:
        assert proc.wait(60) != 0
    finally:
        _stop(proc)
    log = (tmp_path / "gunicorn.log").read_text()
    assert "The database schema is at revision 0001" in log
    assert "run `acceld db upgrade`" in log


def _refused_log(tmp_path: Path, conf: Path) -> str:
    proc = _gunicorn(tmp_path, conf, free_port())
    try:
        assert proc.wait(60) != 0
    finally:
        _stop(proc)
    return (tmp_path / "gunicorn.log").read_text()


def test_wsgi_application_refuses_noauth_without_the_insecure_option(tmp_path: Path) -> None:
    conf = _config(tmp_path, api="")
    subprocess.run([str(BIN / "acceld"), "db", "upgrade", "--config-file", str(conf)],
                   check=True, capture_output=True, timeout=60)
    log = _refused_log(tmp_path, conf)
    assert "acceld.wsgi.api refuses auth_strategy = noauth" in log
    assert "set [api] allow_insecure_noauth = true" in log


def test_wsgi_application_with_keystone_needs_no_insecure_option(tmp_path: Path) -> None:
    """Loads (and asks for a token) with auth_strategy = keystone, the option unset. No
    Keystone runs: a request without a token is refused before one would be asked."""
    conf = _config(tmp_path, api="", default="auth_strategy = keystone\n",
                   extra=f"[keystone_authtoken]\nwww_authenticate_uri = "
                         f"http://127.0.0.1:{free_port()}/v3\n")
    subprocess.run([str(BIN / "acceld"), "db", "upgrade", "--config-file", str(conf)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    proc = _gunicorn(tmp_path, conf, port)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
            try:
                resp = requests.get(f"http://127.0.0.1:{port}/accelerator/v2/device_profiles",
                                    timeout=30)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)
        assert resp.status_code == 401, resp.text
    finally:
        _stop(proc)


def test_metrics_under_another_wsgi_server_say_why_they_are_off(tmp_path: Path) -> None:
    """A plain gunicorn command line has no process that sums the workers' counters: the
    application says so at start, naming the listener (before: no listener, no word)."""
    metrics_port = free_port()
    conf = _config(tmp_path, extra=f"[metrics]\napi_enabled = true\napi_port = {metrics_port}\n")
    subprocess.run([str(BIN / "acceld"), "db", "upgrade", "--config-file", str(conf)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    proc = _gunicorn(tmp_path, conf, port)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
            try:
                requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=30)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.1)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
    finally:
        _stop(proc)
    warnings = [line for line in (tmp_path / "gunicorn.log").read_text().splitlines()
                if " WARNING acceld.metrics.wsgi_server " in line]
    assert len(warnings) == 1, warnings
    assert (f"[metrics] api_enabled = true, but the API's metrics listener "
            f"(127.0.0.1:{metrics_port}) is off: this WSGI server is not uwsgi") in warnings[0]
