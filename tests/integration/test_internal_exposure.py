"""The all-in-one's internal servers against strangers and idle clients (issue 16, items 3, 4).

A real `acceld all`: idle connections held open to the conductor and to the
agent delay nobody's request by more than a second, and a stranger announcing
(or sending) 32 MiB bodies is answered 401 without the server reading or
holding them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from acceld.clients.internal import InternalClient
from acceld.internal import auth
from tests.support import allinone
from tests.support.net import free_port

BIG = 32 * 1024 * 1024
IDLE = 40  # more than the default 16 workers of each internal server
HOST = "exposure-node"


@pytest.fixture(scope="module")
def aio(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("internal-exposure")
    ports = {"conductor": free_port(), "agent": free_port()}
    conf = tmp / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nhost = {HOST}\n"
                    f"[conductor]\nport = {ports['conductor']}\n"
                    f"[agent]\nport = {ports['agent']}\nenabled_drivers = fake\n")
    launched = allinone.launch(str(tmp / "state"), str(conf))
    secret = (tmp / "state" / "internal.secret").read_text().strip().encode()
    yield launched, ports, secret
    allinone.stop(launched.proc)


def _clients(ports: dict[str, int], secret: bytes) -> dict[str, tuple[InternalClient, str, str]]:
    """Who may call each server, and a call it answers: (client, method, path)."""
    return {
        "conductor": (InternalClient(f"http://127.0.0.1:{ports['conductor']}", secret,
                                     destination=auth.CONDUCTOR),
                      "POST", "/binds/wake"),
        "agent": (InternalClient(f"http://127.0.0.1:{ports['agent']}",
                                 auth.Signer(auth.node_key(secret, HOST), HOST),
                                 destination=auth.agent_destination(HOST)),
                  "GET", "/hardware"),
    }


def _rss_kib(service: str, state_path: str) -> int:
    """Resident memory of the all-in-one's ``service`` process."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"acceld.cmd.main" in argv and service.encode() in argv \
                    and state_path.encode() in argv:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            continue
    raise AssertionError(f"no {service} process for {state_path}")


@pytest.mark.integration
@pytest.mark.parametrize("service", ["conductor", "agent"])
def test_idle_connections_delay_nobody(aio, service) -> None:
    launched, ports, secret = aio
    client, method, path = _clients(ports, secret)[service]
    client.call(method, path, {} if method == "POST" else None)
    idle = [socket.create_connection(("127.0.0.1", ports[service]), timeout=5)
            for _ in range(IDLE)]
    try:
        for _ in range(3):
            started = time.monotonic()
            client.call(method, path, {} if method == "POST" else None, timeout=5)
            assert time.monotonic() - started < 1.0
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.integration
@pytest.mark.parametrize("service", ["conductor", "agent"])
def test_a_stranger_announcing_32_mib_gets_401_without_the_body_being_read(
        aio, service) -> None:
    launched, ports, secret = aio
    with socket.create_connection(("127.0.0.1", ports[service]), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % BIG)
        sock.settimeout(2)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in answer, answer[:200]
    assert time.monotonic() - started < 1.0


@pytest.mark.integration
def test_strangers_sending_32_mib_bodies_cost_the_conductor_nothing(aio) -> None:
    """The issue's measurement: six such bodies took the conductor from 82 to 274 MiB."""
    launched, ports, secret = aio
    before = _rss_kib("conductor", launched.state_path)
    answers: list[bytes] = []

    def send() -> None:
        with socket.create_connection(("127.0.0.1", ports["conductor"]), timeout=5) as sock:
            sock.sendall(b"POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG)
            try:
                chunk = b"x" * (1024 * 1024)
                for _ in range(32):
                    sock.sendall(chunk)
            except OSError:
                pass  # the server answered and closed without reading: expected
            try:
                answers.append(sock.recv(64))
            except OSError:
                answers.append(b"")

    senders = [threading.Thread(target=send) for _ in range(6)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(30)
    assert not any(s.is_alive() for s in senders), "a stranger's body was still being taken"
    assert len(answers) == 6, answers
    after = _rss_kib("conductor", launched.state_path)
    assert after - before < 16 * 1024, (before, after)
    assert all(a.startswith(b"HTTP/1.1 401 ") for a in answers if a), answers
    client, method, path = _clients(ports, secret)["conductor"]
    client.call(method, path, {})  # and it still serves
