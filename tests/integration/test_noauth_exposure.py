"""noauth stays on loopback unless told otherwise, and says so at start (issue 16, item 5).

Real `acceld api` / `acceld all` processes: the refusal must happen before
anything listens, with a non-zero exit and a message that says what to do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.support.net import free_port

ACCELD = [sys.executable, "-m", "acceld.cmd.main"]


def _run(argv: list[str], tmp_path, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run to completion; a process still running after ``timeout`` (it served) is a failure."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as out_file, open(err, "w") as err_file:
        proc = subprocess.Popen(argv, stdout=out_file, stderr=err_file, text=True,
                                start_new_session=True)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # `acceld all` stops the services it started
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pytest.fail(f"acceld {argv[3]} started serving instead of refusing")
    return subprocess.CompletedProcess(argv, proc.returncode, out.read_text(), err.read_text())


def _conf(tmp_path, api: str) -> str:
    path = tmp_path / "acceld.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path / 'state'}\n[api]\n{api}\n"
                    f"[conductor]\nport = {free_port()}\n[agent]\nport = {free_port()}\n"
                    "enabled_drivers = fake\n")
    return str(path)


@pytest.mark.parametrize("command", ["api", "all"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "api.example.com"])
def test_noauth_beyond_loopback_is_refused(tmp_path, command, host):
    port = free_port()
    result = _run([*ACCELD, command, "--port", str(port), "--config-file",
                   _conf(tmp_path, f"host_ip = {host}")], tmp_path)
    assert result.returncode == 2
    assert "auth_strategy = noauth" in result.stderr
    assert f"host_ip = {host} is not a loopback address" in result.stderr
    assert "allow_insecure_noauth = true" in result.stderr
    if command == "all":  # refused before starting anything: no state, no database
        assert not (tmp_path / "state").exists()


def test_noauth_on_loopback_starts_with_a_warning(tmp_path):
    port = free_port()
    err = tmp_path / "stderr"
    conf = _conf(tmp_path, "host_ip = 127.0.0.1")
    subprocess.run([*ACCELD, "db", "upgrade", "--config-file", conf], check=True,
                   capture_output=True, timeout=60)  # `acceld api` refuses an old schema
    with open(err, "w") as err_file:
        proc = subprocess.Popen(
            [*ACCELD, "api", "--port", str(port), "--config-file", conf],
            stdout=subprocess.DEVNULL, stderr=err_file, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:  # it serves
            try:
                assert requests.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
                time.sleep(0.1)
        # The warning is logged before gunicorn starts, so it is in the log by now.
        warnings = [line for line in err.read_text().splitlines()
                    if "WARNING" in line and "noauth" in line]
        assert warnings, err.read_text()
        assert f"anyone who can reach 127.0.0.1:{port} is an admin" in warnings[0]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
