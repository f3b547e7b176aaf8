"""Logs as oslo.log writes them, from real processes: with ``log_dir`` each service its own
file named as other OpenStack services name theirs (acceld-api.log, acceld-conductor.log,
acceld-agent.log, acceld-driver-NAME.log; ``acceld all`` gives each child its own), every
line in oslo.log's default format (what kolla's fluentd and OpenStack-Ansible parse),
gunicorn's own lines among them, and the API's DEBUG lines (policy, microversion, database
calls and their time) only with ``debug = true``."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import ADMIN, version
from tests.integration.test_agents import wait_for, write_conf
from tests.support import allinone
from tests.support.driver_processes import read_url, stop
from tests.support.net import free_port

pytestmark = pytest.mark.integration

# oslo.log's default logging_context_format_string / logging_default_format_string:
# "%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(name)s [<context> or -] message",
# and logging_exception_prefix for each line of a traceback.
_STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \d+ "
OSLO_LINE = re.compile(_STAMP + r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                       r"(?P<module>[A-Za-z_][\w.]*) \[(?P<context>[^\]]*)\] (?P<message>.*)$")
OSLO_TRACEBACK = re.compile(_STAMP + r"ERROR (?P<module>[A-Za-z_][\w.]*) .*$")
# A context: "-" outside a request, else global_request_id request_id user project domain
# system_scope user_domain project_domain (oslo.log's logging_user_identity_format).
CONTEXT = re.compile(r"-|(?:req-[0-9a-f-]{36}|None) req-[0-9a-f-]{36}(?: \S+){6}")

DEBUG_LINES = {
    "policy": re.compile(r" DEBUG acceld\.api\.policy \[.*\] policy cyborg:device_profile:get_all:"
                         r" allowed for roles "),
    "microversion": re.compile(r" DEBUG acceld\.api\.middleware \[.*\] microversion 2\.2 "
                               r"for GET /accelerator/v2/device_profiles"),
    "database call": re.compile(r" DEBUG acceld\.db\.calls \[.*\] database call took "
                                r"\d+\.\d ms: SELECT "),
}


def assert_oslo_format(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    assert lines, f"{path.name} is empty"
    for line in lines:
        match = OSLO_LINE.match(line)
        if match is None:
            assert OSLO_TRACEBACK.match(line), f"{path.name}: not oslo.log's format: {line!r}"
            continue
        assert CONTEXT.fullmatch(match["context"]), f"{path.name}: context of {line!r}"
    return lines


def _serve_a_request(url: str) -> None:
    answer = requests.get(f"{url}/device_profiles", headers={**ADMIN, **version("2.2")},
                          timeout=10)
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("debug", [True, False])
def test_each_service_writes_its_own_file_in_oslo_logs_format(tmp_path, debug):
    logs = tmp_path / "logs"
    logs.mkdir()
    agent_port = free_port()
    conf = Path(write_conf(tmp_path / "acceld.conf", {
        "DEFAULT": {"host": "logs-aio", "debug": debug, "log_dir": logs},
        "conductor": {"port": free_port()},
        "agent": {"port": agent_port, "enabled_drivers": "fake", "heartbeat_interval": 1},
    }))
    launched = allinone.launch(str(tmp_path / "state"), str(conf))
    driver = None
    try:
        driver = subprocess.Popen(
            [sys.executable, "-m", "acceld.cmd.main", "driver", "fake", "--config-file", str(conf),
             "--state-path", str(tmp_path / "state"), "--port", str(free_port()),
             "--agent-url", f"http://127.0.0.1:{agent_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        read_url(driver, time.monotonic() + 60, "fake")
        _serve_a_request(launched.url)
        files = {name: logs / f"acceld-{name}.log"
                 for name in ("all", "conductor", "api", "agent", "driver-fake")}
        for name, path in files.items():
            wait_for(lambda: path.exists() and path.stat().st_size > 0, 30, f"{path.name}")
        # The request's access line, then gunicorn's lines in the API's file.
        wait_for(lambda: "GET /accelerator/v2/device_profiles" in files["api"].read_text(),
                 15, "the access line")
    finally:
        if driver is not None:
            stop(driver)
        allinone.stop(launched.proc)
    assert sorted(p.name for p in logs.iterdir()) == sorted(p.name for p in files.values())
    texts = {name: "\n".join(assert_oslo_format(path)) for name, path in files.items()}
    api = texts["api"]
    # The web server's own lines, through oslo.log (not on the terminal in its format).
    assert re.search(r" INFO gunicorn\.error \[-\] Booting worker with pid: \d+", api), api
    assert " INFO gunicorn.error [-] Listening at: http://" in api, api
    printed = "\n".join(launched.lines)
    assert "[INFO]" not in printed and "Booting worker" not in printed, printed
    for what, pattern in DEBUG_LINES.items():
        assert bool(pattern.search(api)) is debug, f"{what} DEBUG line, debug={debug}:\n{api}"
    assert (" DEBUG " in api) is debug
    for name, text in texts.items():  # no service-name field: the file names the service
        assert f" INFO {name} " not in text
