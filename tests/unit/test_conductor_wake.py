"""The API's wake of the conductors does not hold up the request that committed the binds,
and wakes asked while one is being sent go out as one call (acceld.clients.conductor)."""

from __future__ import annotations

import threading
import time

from acceld.clients.conductor import ConductorClient
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app, json_body, respond

SECRET = b"wake-test-secret-0123456789abcdef0123"


def test_wake_binds_returns_at_once_and_coalesces_while_one_is_in_flight() -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[float] = []

    def wake(req, resp) -> None:  # type: ignore[no-untyped-def]
        calls.append(time.monotonic())
        entered.set()
        release.wait(10)
        respond(resp, {"status": "woken"}, status=202)

    app = build_app(SECRET, 60, {"/binds/wake": {"POST": wake}}, destination=auth.CONDUCTOR)
    server = InternalServer(app, "127.0.0.1", 0).start()
    try:
        client = ConductorClient(server.url, SECRET)
        started = time.monotonic()
        client.wake_binds()
        assert entered.wait(10)  # the first wake is being served, and blocks there
        for _ in range(5):
            client.wake_binds()
        assert time.monotonic() - started < 2.0  # nobody waited for the conductor
        assert len(calls) == 1
        release.set()
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(calls) == 2  # the five wakes asked meanwhile: one more call
    finally:
        release.set()
        server.stop()


def test_an_unreachable_conductor_is_only_logged(caplog) -> None:
    client = ConductorClient("http://127.0.0.1:9", SECRET, connect_timeout=0.2)
    caplog.set_level("DEBUG", logger="acceld.clients.conductor")
    client.wake_binds()  # returns; the failure is the waker thread's
    deadline = time.monotonic() + 10
    while "Could not wake" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "Could not wake" in caplog.text


def test_a_wait_for_binds_is_not_repeated_at_the_next_conductor() -> None:
    """A conductor that takes the wait and answers late (saturated) costs the PATCH one
    bind_wait, not one per conductor: no other conductor gets the wait again, only the
    plain wake that follows it."""
    release = threading.Event()
    bodies: list[dict] = []

    def wake(req, resp) -> None:  # type: ignore[no-untyped-def]
        body = json_body(req)
        bodies.append(body)
        if body:  # a wait: this conductor is too busy to answer in time
            release.wait(10)
        respond(resp, {"status": "woken"}, status=202)

    servers = [InternalServer(build_app(SECRET, 60, {"/binds/wake": {"POST": wake}},
                                        destination=auth.CONDUCTOR), "127.0.0.1", 0).start()
               for _ in range(2)]
    try:
        client = ConductorClient([s.url for s in servers], SECRET)
        assert client.wait_for_binds([7], 0.2) == 0  # no answer in time
        deadline = time.monotonic() + 10
        while {} not in bodies and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bodies[0] == {"arq_ids": [7], "wait": 0.2}
        assert bodies[1:] == [{}]  # the fallback wake (its thread's), and no second wait
    finally:
        release.set()
        for server in servers:
            server.stop()
