"""Clients of several conductors: fail over when one does not answer, log each outage once
each way, stick with the one that answers, return to the preferred one, spread over the
list, and never repeat a call that must not run twice. Real signed internal servers on
loopback; a dead conductor is a free port nobody listens on."""

from __future__ import annotations

import logging
import threading
from typing import Iterator

import pytest
import requests

from acceld.clients.conductor import FailoverClient, conductor_urls
from acceld.internal.auth import CONDUCTOR
from acceld.internal.server import InternalServer, respond, serve
from acceld.outages import OutageLog
from tests.conftest import make_conf
from tests.support.net import free_port

SECRET = b"failover-test-secret-0123456789abcdef"


class Conductor:
    """An internal server named like a conductor that counts its calls."""

    def __init__(self, tmp_path, name: str, port: int = 0) -> None:
        self.name = name
        self.calls: list[str] = []
        self.release = threading.Event()  # /slow waits for it (a hung conductor)

        def hello(req, resp) -> None:  # type: ignore[no-untyped-def]
            self.calls.append("hello")
            respond(resp, {"name": name})

        def slow(req, resp) -> None:  # type: ignore[no-untyped-def]
            self.calls.append("slow")
            self.release.wait(10)
            respond(resp, {"name": name})

        self.server: InternalServer = serve(
            make_conf(str(tmp_path)), SECRET, {"/hello": {"POST": hello},
                                               "/slow": {"POST": slow}},
            "127.0.0.1", port, destination=CONDUCTOR)
        self.url = self.server.url

    def stop(self) -> None:
        self.release.set()
        self.server.stop()


@pytest.fixture
def pair(tmp_path) -> Iterator[tuple[Conductor, Conductor]]:
    a, b = Conductor(tmp_path, "a"), Conductor(tmp_path, "b")
    yield a, b
    a.stop()
    b.stop()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def outage_lines(caplog, url: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "acceld.clients.conductor" and f"Conductor {url} " in r.getMessage()]


def test_a_dead_conductor_is_passed_over_logged_once_and_not_tried_again(pair, caplog):
    a, _ = pair
    dead = dead_url()
    client = FailoverClient([dead, a.url], SECRET, timeout=5)
    with caplog.at_level(logging.DEBUG, logger="acceld.clients.conductor"):
        answers = [client.call("POST", "/hello", {}) for _ in range(5)]
    assert answers == [{"name": "a"}] * 5
    assert a.calls == ["hello"] * 5
    lines = outage_lines(caplog, dead)
    # One WARNING when it went away, and no later try (no "still unavailable" line).
    assert len(lines) == 1 and lines[0].startswith(f"Conductor {dead} is unavailable"), lines
    assert "calls go to the next conductor" in lines[0]
    assert client.base_url == a.url


def test_after_failback_interval_the_preferred_conductor_is_tried_again(tmp_path, pair, caplog):
    _, b = pair
    port = free_port()
    preferred = f"http://127.0.0.1:{port}"
    now = [0.0]
    log = OutageLog(logging.getLogger("acceld.clients.conductor"), clock=lambda: now[0])
    client = FailoverClient([preferred, b.url], SECRET, timeout=5, failback_interval=60,
                            clock=lambda: now[0], outages=log)
    assert client.call("POST", "/hello", {}) == {"name": "b"}
    back = Conductor(tmp_path, "back", port)  # the preferred conductor returns
    try:
        now[0] = 59.0
        assert client.call("POST", "/hello", {}) == {"name": "b"}  # not yet
        assert back.calls == []
        now[0] = 61.0
        with caplog.at_level(logging.INFO, logger="acceld.clients.conductor"):
            # The call goes where calls go now; the preferred one is probed beside it.
            assert client.call("POST", "/hello", {}) == {"name": "b"}
            client.join_probe(5)
            assert client.call("POST", "/hello", {}) == {"name": "back"}
            assert client.call("POST", "/hello", {}) == {"name": "back"}  # and stays
        assert back.calls == ["hello", "hello", "hello"]  # the probe, then the calls
        assert b.calls == ["hello"] * 3
        lines = outage_lines(caplog, preferred)  # once when it went, once when it is back
        assert len(lines) == 2, lines
        assert "is unavailable" in lines[0] and "is available again after" in lines[1], lines
    finally:
        back.stop()


def test_a_failed_probe_of_the_preferred_conductor_falls_back_without_a_new_warning(
        pair, caplog):
    _, b = pair
    preferred = dead_url()
    now = [0.0]
    client = FailoverClient([preferred, b.url], SECRET, timeout=5, failback_interval=60,
                            clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="acceld.clients.conductor"):
        client.call("POST", "/hello", {})
        now[0] = 100.0
        assert client.call("POST", "/hello", {}) == {"name": "b"}
        client.join_probe(5)
        assert client.call("POST", "/hello", {}) == {"name": "b"}  # the probe failed: stays
    assert len(outage_lines(caplog, preferred)) == 1
    assert b.calls == ["hello"] * 3


def test_a_call_that_must_not_run_twice_is_not_repeated_after_no_answer(pair):
    hung, b = pair
    client = FailoverClient([hung.url, b.url], SECRET, timeout=0.5)
    with pytest.raises(requests.Timeout):
        client.call("POST", "/slow", {}, repeatable=False)
    assert hung.calls == ["slow"] and b.calls == []  # it may be running there: not twice
    # A repeatable one moves on after the same silence (b answers at once).
    b.release.set()
    client = FailoverClient([hung.url, b.url], SECRET, timeout=0.5)
    assert client.call("POST", "/slow", {}) == {"name": "b"}


def test_a_call_that_must_not_run_twice_moves_on_when_it_surely_never_arrived(pair):
    _, b = pair
    client = FailoverClient([dead_url(), b.url], SECRET, timeout=5)
    assert client.call("POST", "/hello", {}, repeatable=False) == {"name": "b"}


def test_clients_of_one_process_log_a_conductor_outage_once_between_them(pair, caplog):
    a, _ = pair
    dead = dead_url()
    hellos = FailoverClient([dead, a.url], SECRET, timeout=5)
    reports = FailoverClient([dead, a.url], SECRET, timeout=5)
    hellos.call("POST", "/hello", {})
    reports.call("POST", "/hello", {})
    assert len(outage_lines(caplog, dead)) == 1


def test_no_conductor_answering_raises_the_last_error():
    client = FailoverClient([dead_url(), dead_url()], SECRET, timeout=1)
    with pytest.raises(requests.ConnectionError):
        client.call("POST", "/hello", {})


def test_clients_with_the_same_list_spread_over_it():
    urls = ["http://c1:6667", "http://c2:6667", "http://c3:6667"]
    firsts = {FailoverClient(urls, SECRET, prefer=f"compute-{i}").urls[0] for i in range(30)}
    assert firsts == set(urls)
    one = FailoverClient(urls, SECRET, prefer="compute-7")
    assert one.urls == FailoverClient(urls, SECRET, prefer="compute-7").urls  # stable
    assert sorted(one.urls) == urls  # a rotation: every conductor is still there


def test_conductor_url_takes_one_url_a_list_or_none(tmp_path):
    assert conductor_urls(make_conf(str(tmp_path), conductor__url="http://lb:6667")) == [
        "http://lb:6667"]
    assert conductor_urls(make_conf(
        str(tmp_path), conductor__url="http://c1:6667, http://c2:6667")) == [
        "http://c1:6667", "http://c2:6667"]
    assert conductor_urls(make_conf(str(tmp_path), conductor__port=7000)) == [
        "http://127.0.0.1:7000"]
