"""The API under uwsgi (the ``pyuwsgi`` wheel) from the shipped recipe,
etc/uwsgi/acceld-api.ini, with Keystone auth (a real Keystone) and metrics: the uwsgi
master serves ``[metrics] api_enabled``'s /metrics, summing what every worker counted
(acceld.metrics.wsgi_server); before, the listener silently did not start there.

Only what a machine's paths and ports dictate is changed in the recipe (each key changed
must be in the shipped file), and the workers are fewer, for a test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from acceld.db import migrate
from acceld.db.engine import Database
from tests.support.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "etc" / "uwsgi" / "acceld-api.ini"
UWSGI = Path(sys.executable).with_name("uwsgi")
WORKERS = 2
REQUESTS = 12
PROFILE = "uwsgi-fpga"


def recipe_for_test(changes: dict[str, str]) -> str:
    """The shipped ini with ``changes`` (key -> value) applied; every key must be there."""
    text = RECIPE.read_text()
    for key, value in changes.items():
        text, count = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}", text,
                              flags=re.M)
        assert count == 1, f"{RECIPE.name} has no single '{key} = ' line"
    return text


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # die-on-term
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def uwsgi_api(ks, tmp_path_factory) -> Iterator[dict]:
    if not UWSGI.exists():
        pytest.skip("uwsgi is not installed in this virtualenv (pip install -e '.[test]' "
                    "installs the pyuwsgi wheel)")
    tmp = tmp_path_factory.mktemp("uwsgi")
    state, logs = tmp / "state", tmp / "logs"
    state.mkdir(mode=0o700)
    logs.mkdir()
    metrics_port = free_port()
    db_url = f"sqlite:///{state}/acceld.sqlite"
    conf = tmp / "acceld.conf"
    conf.write_text(
        f"[DEFAULT]\nauth_strategy = keystone\nstate_path = {state}\nlog_dir = {logs}\n"
        f"[database]\nconnection = {db_url}\n"
        f"[internal]\nshared_secret = internal-secret-for-the-uwsgi-test\n"
        f"[metrics]\napi_enabled = true\napi_port = {metrics_port}\n"
        + ks.authtoken_section())
    db = Database(db_url)
    migrate.upgrade(db)
    ini = tmp / "acceld-api.ini"
    ini.write_text(recipe_for_test({
        "virtualenv": sys.prefix,
        "http-socket": f"127.0.0.1:{ks.api_port}",
        "processes": str(WORKERS),
        "threads": "2",
        "logto": str(logs / "acceld-api-uwsgi.log"),
    }))
    # The configuration file as a systemd unit's Environment= names it.
    proc = subprocess.Popen([str(UWSGI), "--ini", str(ini)], cwd=tmp,
                            env={**os.environ, "OS_ACCELD_CONFIG_FILES": str(conf)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{ks.api_port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            uwsgi_log = logs / "acceld-api-uwsgi.log"
            assert proc.poll() is None, uwsgi_log.read_text()[-3000:] if uwsgi_log.exists() \
                else "uwsgi exited"
            try:
                if requests.get(base + "/accelerator/v2", timeout=30).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "uwsgi did not serve the API"
            time.sleep(0.2)
        yield {"base": base, "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
               "logs": logs, "proc": proc}
    finally:
        _stop(proc)
        db.dispose()


def _call(api: dict, method: str, path: str, token: str | None = None,
          **kwargs) -> requests.Response:
    headers = {"X-Auth-Token": token} if token else {}
    return requests.request(method, f"{api['base']}/accelerator/v2{path}", headers=headers,
                            timeout=30, **kwargs)


def _samples(url: str) -> dict[tuple[str, frozenset], float]:
    resp = requests.get(url, timeout=30)
    assert resp.status_code == 200, resp.text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def test_keystone_auth_under_uwsgi(uwsgi_api, ks) -> None:
    assert _call(uwsgi_api, "GET", "/device_profiles").status_code == 401
    bogus = _call(uwsgi_api, "GET", "/device_profiles", "gAAAA-bogus")
    assert bogus.status_code == 401
    body = [{"name": PROFILE, "groups": [{"resources:FPGA": "1"}]}]
    denied = _call(uwsgi_api, "POST", "/device_profiles", ks.token("demo-member"), json=body)
    assert denied.status_code == 403, denied.text
    created = _call(uwsgi_api, "POST", "/device_profiles", ks.token("demo-admin"), json=body)
    assert created.status_code == 201, created.text
    listed = _call(uwsgi_api, "GET", "/device_profiles", ks.token("demo-reader"))
    assert [p["name"] for p in listed.json()["device_profiles"]] == [PROFILE]


def test_metrics_under_uwsgi_served_by_the_master(uwsgi_api, ks) -> None:
    token = ks.token("demo-reader")
    counted = ("acceld_api_requests_total", frozenset(
        {"route": "/v2/device_profiles", "method": "GET", "status": "200"}.items()))
    before = _samples(uwsgi_api["metrics"]).get(counted, 0)
    for _ in range(REQUESTS):
        # A new connection each time: uwsgi hands them to whichever worker accepts.
        resp = requests.get(f"{uwsgi_api['base']}/accelerator/v2/device_profiles", timeout=30,
                            headers={"X-Auth-Token": token, "Connection": "close"})
        assert resp.status_code == 200, resp.text
    samples = _samples(uwsgi_api["metrics"])
    assert samples.get(counted) == before + REQUESTS, sorted(
        key for key in samples if key[0].startswith("acceld_api"))
    assert samples[("acceld_inventory_up", frozenset())] == 1  # read from the database
    # The listener is the master's: one process, however many workers answered.
    api_log = (uwsgi_api["logs"] / "acceld-api.log").read_text()
    (started,) = re.findall(r"API metrics at (\S+) \(uwsgi master (\d+),", api_log)
    assert started[0] == uwsgi_api["metrics"]
    assert int(started[1]) == uwsgi_api["proc"].pid
    pids = {int(p) for p in re.findall(r"^\S+ \S+ (\d+) INFO acceld\.api\.access ", api_log,
                                       re.M)}
    assert pids and uwsgi_api["proc"].pid not in pids  # workers answered, not the master
    assert "metrics listener" not in api_log  # no WARNING that it is off


def test_the_recipe_is_what_the_test_serves() -> None:
    """The keys the test changes are paths, ports and sizes; what makes the metrics work
    (a master loading the app, threads) and the refusals fatal is the shipped recipe's."""
    text = RECIPE.read_text()
    for line in ("module = acceld.wsgi.api:application", "need-app = true", "master = true",
                 "enable-threads = true", "lazy-apps = false", "die-on-term = true"):
        assert re.search(rf"^{re.escape(line)}$", text, re.M), line
