"""An agent leaves a sick conductor in time, and its failback probe never silences it.

Real agents and conductor stand-ins on loopback (signed internal servers that take the
agent's key): one answering 503 (a conductor that lost its database), one that takes the
connection and never answers (a hung conductor), healthy ones. The bound is the agent's
down window: ``agent_down_intervals`` heartbeats after its last hello that was taken, a
sweep marks it down.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import falcon
import pytest

from acceld.agent.service import Agent
from acceld.clients.conductor import _start_index
from acceld.internal.auth import CONDUCTOR
from acceld.internal.server import respond, serve
from acceld.runtime.secrets import ensure_secret_file
from tests.conftest import make_conf
from tests.support.net import free_port

HOST = next(f"node-{i}" for i in range(100) if _start_index(f"node-{i}", 2) == 0)


class StandIn:
    """A conductor's /hello: ``ok`` answers, ``sick`` answers 503, ``hang`` holds the
    call unanswered until the test ends. Records when each hello arrived, in which mode."""

    def __init__(self, conf, keys, port: int = 0, mode: str = "ok") -> None:  # type: ignore[no-untyped-def]
        self.mode = mode
        self.hellos: list[tuple[float, str]] = []
        self.arrived = threading.Condition()
        self.release = threading.Event()

        def hello(req, resp) -> None:  # type: ignore[no-untyped-def]
            mode = self.mode
            with self.arrived:
                self.hellos.append((time.monotonic(), mode))
                self.arrived.notify_all()
            if mode == "sick":
                raise falcon.HTTPServiceUnavailable(
                    description="The database cannot be reached; try again later.")
            if mode == "hang":
                self.release.wait(60)
                return
            respond(resp, {"status": "OK", "pulled": False})

        self.server = serve(conf, keys, {"/hello": {"POST": hello}}, "127.0.0.1", port,
                            destination=CONDUCTOR)
        self.url = self.server.url

    def answered(self) -> list[float]:
        with self.arrived:
            return [at for at, mode in self.hellos if mode == "ok"]

    def wait_for(self, count: int, seconds: float, mode: str = "ok") -> bool:
        """True once ``count`` hellos arrived in ``mode`` (False after ``seconds``)."""
        with self.arrived:
            return self.arrived.wait_for(
                lambda: sum(1 for _, m in self.hellos if m == mode) >= count, seconds)

    def stop(self) -> None:
        self.release.set()
        self.server.stop()


@pytest.fixture
def cluster(tmp_path) -> Iterator:  # type: ignore[type-arg]
    """``start(urls_of, interval, down_intervals, failback)``: an agent (HOST, whose list
    order is the given one) of stand-ins made by ``urls_of(conf, keys)``."""
    ensure_secret_file(str(tmp_path))
    made: list[object] = []

    def start(stand_ins, interval: int, down_intervals: int, failback: float = 60.0):  # type: ignore[no-untyped-def]
        conf = make_conf(str(tmp_path), agent__port=0, agent__heartbeat_interval=interval,
                         agent__discovery_interval=3600,
                         conductor__agent_down_intervals=down_intervals,
                         conductor__failback_interval=failback)
        agent = Agent(conf, HOST, drivers=[])
        peers = stand_ins(conf, agent.keys)
        made.extend(peers)
        conf.set_override("url", [p if isinstance(p, str) else p.url for p in peers],
                          group="conductor")
        made.append(agent.start())
        return conf, agent, peers

    yield start
    for thing in reversed(made):
        if isinstance(thing, (Agent, StandIn)):
            thing.stop()


def test_hello_timeouts_fit_the_down_window(tmp_path):
    from acceld.clients.conductor import hello_timeouts

    for interval, down in ((1, 2), (1, 5), (10, 3), (60, 10)):
        conf = make_conf(str(tmp_path), agent__heartbeat_interval=interval,
                         conductor__agent_down_intervals=down)
        timeouts = hello_timeouts(conf)
        # The next hello leaves an interval after the last one taken; a conductor that
        # takes no connection or gives no answer leaves the next one time to answer.
        assert interval + max(timeouts.connect, timeouts.answer) < interval * down
        assert timeouts.connect <= conf.conductor.connect_timeout
        # A hello that may carry a pull waits for the pull ([conductor]
        # hardware_pull_timeout) and the reconcile after it.
        assert timeouts.pull > timeouts.answer + conf.conductor.hardware_pull_timeout
    conf = make_conf(str(tmp_path), conductor__hardware_pull_timeout=45.0)
    assert hello_timeouts(conf).pull > hello_timeouts(conf).answer + 45.0


def test_an_agent_leaves_a_conductor_that_answers_503(cluster):
    conf, agent, (sick, healthy) = cluster(
        lambda conf, keys: [StandIn(conf, keys, mode="sick"), StandIn(conf, keys)],
        interval=1, down_intervals=5)
    assert sick.wait_for(1, 10, mode="sick")
    assert healthy.wait_for(2, 10), "the agent stayed with the conductor answering 503"
    moved_after = healthy.answered()[0] - sick.hellos[0][0]
    assert moved_after < conf.agent.heartbeat_interval * conf.conductor.agent_down_intervals
    assert len(sick.hellos) == 1  # and it stays with the one that answered
    assert agent.hello is not None and agent.hello.client.base_url == healthy.url


def test_an_agent_leaves_a_conductor_that_hangs_within_its_down_window(cluster):
    conf, agent, (hung, healthy) = cluster(
        lambda conf, keys: [StandIn(conf, keys), StandIn(conf, keys)],
        interval=1, down_intervals=5)
    assert hung.wait_for(2, 10)  # the agent's hellos go to its first conductor, taken
    hung.mode = "hang"  # it hangs: takes connections, answers nothing
    assert hung.wait_for(1, 10, mode="hang")
    last_taken = hung.answered()[-1]
    assert healthy.wait_for(1, 10), "the agent waited on the hung conductor"
    silent = healthy.answered()[0] - last_taken
    assert silent < conf.agent.heartbeat_interval * conf.conductor.agent_down_intervals, silent


def test_a_failback_probe_of_a_hung_conductor_never_stops_the_heartbeats(cluster):
    port = free_port()  # the preferred conductor: away at first (nobody listens)
    conf, agent, (preferred, current) = cluster(
        lambda conf, keys: [f"http://127.0.0.1:{port}", StandIn(conf, keys)],
        interval=1, down_intervals=21, failback=1.0)  # a probe may wait 10 s for its answer
    assert current.wait_for(1, 10)  # failed over at once (connection refused)
    hung = StandIn(conf, agent.keys, port=port, mode="hang")  # back, and hung
    try:
        assert hung.wait_for(1, 10, mode="hang"), "no failback probe"
        before = len(current.answered())
        # While the probe waits for the hung conductor, the heartbeats go on where they go.
        assert current.wait_for(before + 2, 8), "the probe held up the heartbeats"
        assert agent.hello is not None
        assert agent.hello.client.base_url == current.url  # not moved: no answer yet
        from acceld.clients.conductor import hello_timeouts

        # A loop held up by the probe would show a gap of the probe's whole timeout.
        gaps = [b - a for a, b in zip(current.answered(), current.answered()[1:])]
        assert max(gaps) < hello_timeouts(conf).answer, gaps
    finally:
        hung.stop()


def test_a_failback_probe_answered_moves_the_hellos_back(cluster):
    port = free_port()
    conf, agent, (_, current) = cluster(
        lambda conf, keys: [f"http://127.0.0.1:{port}", StandIn(conf, keys)],
        interval=1, down_intervals=5, failback=1.0)
    assert current.wait_for(1, 10)
    back = StandIn(conf, agent.keys, port=port)
    try:
        assert back.wait_for(2, 10), "the hellos did not return to the preferred conductor"
        assert agent.hello is not None and agent.hello.client.base_url == back.url
    finally:
        back.stop()
