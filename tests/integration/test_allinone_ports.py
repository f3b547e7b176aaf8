"""`acceld all` and its ports: a taken port stops the start in one line naming the option,
with nothing left running; `--port P` moves every service (P, P+1, P+2), so two
all-in-ones run side by side on one machine."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.support.net import free_port


def free_triple() -> int:
    """A port P with P, P+1 and P+2 free on 127.0.0.1 (the all-in-one's three)."""
    for _ in range(200):
        base = free_port()
        if all(_bindable(base + n) for n in (1, 2)):
            return base
    raise RuntimeError("no three consecutive free ports")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _config(tmp_path, host: str) -> str:
    path = tmp_path / f"{host}.conf"
    path.write_text(f"[DEFAULT]\nhost = {host}\n[agent]\nenabled_drivers = fake\n"
                    "heartbeat_interval = 1\n[api]\nworkers = 1\n")
    return str(path)


def _all(base: int, state: str, conf: str, **kwargs) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [sys.executable, "-m", "acceld.cmd.main", "all", "--port", str(base), "--state-path", state,
         "--config-file", conf], text=True, start_new_session=True, **kwargs)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("offset,service", [(0, "api"), (1, "conductor"), (2, "agent")])
def test_a_taken_port_stops_the_start_in_one_line(tmp_path, offset, service):
    """Another process (here a test socket) listens on one of the ports: `acceld all` prints
    one line naming the address and the option, exits 2 and leaves nothing listening (it
    started nothing). Before: a CRITICAL traceback from the service, a false "acceld
    conductor: URL" (the readiness probe reached the other process), exit 1."""
    base = free_triple()
    taken = base + offset
    holder = socket.create_server(("127.0.0.1", taken))
    try:
        proc = _all(base, str(tmp_path / "state"), _config(tmp_path, "aio-taken"),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            _stop(proc)
        assert proc.returncode == 2, (out, err)
        assert out == ""  # no service announced
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"acceld all: 127.0.0.1:{taken} is already in use by "
                                   f"another process: it is the {service}'s port, set by "
                                   f"[{service}] port (--port {base}"), lines[0]
        assert "--port P" in lines[0]
        others = [base + n for n in range(3) if n != offset]
        assert all(_bindable(port) for port in others)  # nothing was started
    finally:
        holder.close()


def test_two_ports_given_the_same_value_are_refused(tmp_path):
    """[agent] port configured onto the conductor's place: refused before anything starts."""
    base = free_triple()
    conf = tmp_path / "same.conf"
    conf.write_text(f"[agent]\nport = {base + 1}\nenabled_drivers = fake\n")
    done = subprocess.run([sys.executable, "-m", "acceld.cmd.main", "all", "--port", str(base),
                           "--state-path", str(tmp_path / "state"), "--config-file", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"acceld all: 127.0.0.1:{base + 1} is both the conductor's port ([conductor] port, "
        f"--port {base} + 1) and the agent's ([agent] port, {conf}): give one of them "
        "another port")


def _announced(proc: subprocess.Popen, count: int, timeout: float) -> list[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in iter(proc.stdout.readline, ""):
            lines.put(line.strip())
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line, f"acceld all exited early: {seen}"
        seen.append(line)
    return seen


def _deployables(api: str, timeout: float) -> list[dict]:
    """The API's deployables once the agent's hello reached the conductor (the fake FPGA)."""
    deadline = time.monotonic() + timeout
    while True:
        found = requests.get(f"{api}/deployables", timeout=5).json()["deployables"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_two_all_in_ones_side_by_side(tmp_path):
    """`--port P` and `--port Q` with nothing configured: each all-in-one's API, conductor
    and agent on its own three ports, and each agent reports to its own conductor (its
    host's FPGA shows in its own API only). Before: both conductors on 6667."""
    first = free_triple()
    procs = [_all(first, str(tmp_path / "one"), _config(tmp_path, "aio-one"),
                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)]
    try:
        one = _announced(procs[0], 3, 90)
        second = free_triple()
        procs.append(_all(second, str(tmp_path / "two"), _config(tmp_path, "aio-two"),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        two = _announced(procs[1], 3, 90)
        for base, lines in ((first, one), (second, two)):
            assert sorted(lines) == sorted([
                f"acceld conductor: http://127.0.0.1:{base + 1}",
                f"acceld api: http://127.0.0.1:{base}/accelerator/v2",
                f"acceld agent: http://127.0.0.1:{base + 2}"])
        for base, host in ((first, "aio-one"), (second, "aio-two")):
            devices = _deployables(f"http://127.0.0.1:{base}/accelerator/v2", 60)
            assert devices, f"the agent on {base + 2} did not reach its conductor"
            hosts = {d["hostname"] for d in requests.get(
                f"http://127.0.0.1:{base}/accelerator/v2/devices", timeout=5).json()["devices"]}
            assert hosts == {host}
    finally:
        for proc in procs:
            _stop(proc)


@pytest.mark.parametrize("service", ["conductor", "agent"])
def test_a_service_whose_port_is_taken_says_so_in_one_line(tmp_path, service):
    """`acceld conductor` / `acceld agent` alone (or started by an all-in-one after another
    process took the port): one line naming the address and the option, exit 2."""
    port = free_port()
    holder = socket.create_server(("127.0.0.1", port))
    try:
        state = str(tmp_path / "state")
        assert subprocess.run([sys.executable, "-m", "acceld.cmd.main", "db", "upgrade",
                               "--state-path", state], capture_output=True,
                              timeout=60).returncode == 0
        done = subprocess.run(
            [sys.executable, "-m", "acceld.cmd.main", service, "--port", str(port), "--state-path",
             state, "--config-file", _config(tmp_path, "svc-taken")],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "OS_INTERNAL__SHARED_SECRET": "1" * 64})
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "CRITICAL" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"acceld {service}: 127.0.0.1:{port} is already in use by another process: it is the "
        f"{service}'s port, set by [{service}] port or --port (the command line)")
