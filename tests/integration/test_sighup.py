"""SIGHUP (what logrotate sends) never ends a service: each one re-reads its config files
(options marked mutable, e.g. ``debug``, take their new values), reopens its log file at
the configured path, and goes on serving.

Real processes on loopback, SQLite; each test renames the log files, switches ``debug``
on in the config file, sends SIGHUP and waits (bounded) for the reload line in a new
file at the original path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from acceld.runtime.secrets import ensure_secret_file
from tests.integration.test_agents import Process, wait_for, write_conf
from tests.support import allinone
from tests.support.net import free_port

pytestmark = pytest.mark.integration

RELOADED = "SIGHUP: configuration re-read, log file reopened"


def rotate_and_hup(log: Path, conf: Path, pid: int) -> None:
    """What logrotate does (rename, then SIGHUP), after an operator turned debug on."""
    wait_for(lambda: log.exists() and log.stat().st_size > 0, 30, f"{log.name} written")
    os.rename(log, log.with_suffix(".log.1"))
    conf.write_text(conf.read_text().replace("debug = False", "debug = True"))
    os.kill(pid, signal.SIGHUP)


def test_conductor_agent_and_driver_survive_sighup(tmp_path):
    state = tmp_path / "state"
    ensure_secret_file(str(state))
    secret = (state / "internal.secret").read_text().strip().encode()
    host = "hup-node"
    ports = {"conductor": free_port(), "agent": free_port(), "driver": free_port()}
    common = {"state_path": state, "host": host, "debug": False}
    conductor_url = f"http://127.0.0.1:{ports['conductor']}"
    confs = {name: Path(write_conf(tmp_path / f"{name}.conf", {
        "DEFAULT": {**common, "log_file": tmp_path / f"{name}.log"},
        "conductor": {"port": ports["conductor"], "url": conductor_url},
        "agent": {"port": ports["agent"], "enabled_drivers": "", "heartbeat_interval": 1},
    })) for name in ports}
    upgrade = write_conf(tmp_path / "db.conf", {"DEFAULT": common})
    subprocess.run([sys.executable, "-m", "acceld.cmd.main", "db", "upgrade", "--config-file",
                    upgrade], check=True, capture_output=True, timeout=60)
    procs = {
        "conductor": Process("conductor", ["conductor", "--config-file",
                                           str(confs["conductor"])], tmp_path, ports["conductor"]),
        "agent": Process("agent", ["agent", "--config-file", str(confs["agent"])], tmp_path,
                         ports["agent"]),
        "driver": Process("driver", ["driver", "fake", "--config-file", str(confs["driver"]),
                                     "--port", str(ports["driver"]), "--agent-url",
                                     f"http://127.0.0.1:{ports['agent']}"], tmp_path,
                          ports["driver"]),
    }
    # Process logs its stdout/stderr to <name>.log: give it another name than log_file.
    for proc in procs.values():
        proc.log_path = tmp_path / f"{proc.name}.out"
    try:
        for proc in procs.values():
            proc.start()
        node = auth.Signer(auth.node_key(secret, host), host)
        calls = {
            "conductor": lambda: InternalClient(conductor_url, secret,
                                                destination=auth.CONDUCTOR).call(
                "POST", "/binds/wake", {}),
            "agent": lambda: InternalClient(f"http://127.0.0.1:{ports['agent']}", node,
                                            destination=auth.agent_destination(host)).call(
                "GET", "/hardware"),
            "driver": lambda: InternalClient(
                f"http://127.0.0.1:{ports['driver']}", node,
                destination=auth.driver_destination(f"127.0.0.1:{ports['driver']}")).call(
                "GET", "/hardware"),
        }
        for name, proc in procs.items():
            log = tmp_path / f"{name}.log"
            rotate_and_hup(log, confs[name], proc.proc.pid)
            wait_for(lambda: log.exists() and RELOADED in log.read_text(), 15,
                     f"{name} reopening {log.name}")
            assert proc.proc.poll() is None, f"{name} exited on SIGHUP:\n{proc.log()}"
            calls[name]()  # it serves
            text = log.read_text()
            assert "DEFAULT.debug: False -> True" in text, text
            # debug is mutable: the call just served is logged at DEBUG now.
            wait_for(lambda: " DEBUG " in log.read_text(), 10, f"{name} logging at DEBUG")
            assert RELOADED not in (tmp_path / f"{name}.log.1").read_text()
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()


def test_all_in_one_forwards_sighup_and_the_api_keeps_serving(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    conf = Path(write_conf(tmp_path / "acceld.conf", {
        "DEFAULT": {"host": "hup-aio", "debug": False, "log_dir": logs},
        "conductor": {"port": free_port()},
        "agent": {"port": free_port(), "enabled_drivers": "fake", "heartbeat_interval": 1},
    }))
    # Each service its own file under log_dir, `acceld all` too.
    files = {service: logs / f"acceld-{service}.log"
             for service in ("all", "conductor", "agent", "api")}
    launched = allinone.launch(str(tmp_path / "state"), str(conf))
    failures: list[str] = []
    served = 0
    stop_polling = threading.Event()

    def poll() -> None:
        nonlocal served
        while not stop_polling.is_set():
            try:
                status = requests.get(launched.url, timeout=10).status_code
                if status != 200:
                    failures.append(str(status))
                served += 1
            except requests.RequestException as exc:
                failures.append(repr(exc))
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        for log in files.values():
            wait_for(lambda: log.exists() and log.stat().st_size > 0, 30, f"{log.name} written")
        poller.start()
        for log in files.values():  # logrotate renames them all, then signals
            os.rename(log, log.with_suffix(".log.1"))
        conf.write_text(conf.read_text().replace("debug = False", "debug = True"))
        os.kill(launched.proc.pid, signal.SIGHUP)
        for service, log in files.items():
            wait_for(lambda: log.exists() and RELOADED in log.read_text(), 30,
                     f"{service} reopening {log.name}")
        before = served
        wait_for(lambda: served > before + 20, 15, "the API answering after the reload")
        time.sleep(1.0)  # `acceld all` checks its children every 0.2 s: none has exited
        assert launched.proc.poll() is None, "\n".join(launched.lines[-40:])
        stop_polling.set()
        poller.join(15)
        assert failures == []
    finally:
        stop_polling.set()
        allinone.stop(launched.proc)
