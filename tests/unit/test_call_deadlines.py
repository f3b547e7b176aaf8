"""Every call to a peer ends within its total deadline, whatever the peer does.

Peers on 127.0.0.1 that accept the connection and never answer, or answer one
byte at a time (each read is quick, so a read timeout never fires): Nova,
Placement, Glance, an agent and a driver process's agent. The read timeouts are
set far above the deadlines, so only the deadline can end the calls; the bounds
asserted are generous (a loaded machine), far below what the peers would hold.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
import requests

from acceld import outages
from acceld.agent import hardware, images
from acceld.clients import deadline as deadlines
from acceld.clients import nova
from acceld.clients import placement as pl
from acceld.clients.agent import AgentCallError, AgentCaller
from acceld.internal.auth import Signer
from tests.conftest import make_conf
from tests.support.stalling import StallingPeer

# Seconds a 1 s deadline may take to show on a loaded machine; a stalled peer holds forever.
BOUND = 10.0


@pytest.fixture(params=["silent", "trickle"])
def peer(request):
    server = StallingPeer(request.param, interval=0.1).start()
    yield server
    server.stop()


def _timed(fn):  # type: ignore[no-untyped-def]
    started = time.monotonic()
    try:
        return fn(), time.monotonic() - started
    except Exception as exc:  # noqa: BLE001 - returned for the test to judge
        return exc, time.monotonic() - started


def test_a_watched_session_ends_at_the_deadline(peer):
    session = deadlines.watch(requests.Session())

    def call() -> None:
        with deadlines.bounded(1.0, "the peer"):
            session.get(peer.url, timeout=(5, 600))

    error, elapsed = _timed(call)
    assert isinstance(error, deadlines.DeadlinePassed), error
    assert error.what == "the peer"
    assert 0.9 <= elapsed < BOUND
    assert peer.requested.is_set()


def test_an_inner_block_ends_with_the_outer_one(peer):
    session = deadlines.watch(requests.Session())

    def call() -> None:
        with deadlines.bounded(1.0, "the lease"), deadlines.bounded(600, "Nova"):
            session.get(peer.url, timeout=(5, 600))

    error, elapsed = _timed(call)
    assert isinstance(error, deadlines.DeadlinePassed) and error.what == "the lease"
    assert elapsed < BOUND


def test_an_attempt_after_the_end_is_not_sent(peer):
    session = deadlines.watch(requests.Session())
    with pytest.raises(deadlines.DeadlinePassed):
        with deadlines.bounded(0, "the peer"):
            session.get(peer.url, timeout=5)
    assert not peer.accepted.is_set()


def test_a_bound_counted_from_an_earlier_reading_sends_nothing_once_passed(peer):
    """``since``: the seconds count from a reading taken before the block (a lease read):
    a thread that spent them between the reading and the block sends nothing."""
    session = deadlines.watch(requests.Session())
    read_at = deadlines.now() - 5.0  # the lease was read 5 s ago, with 3 s left
    with pytest.raises(deadlines.DeadlinePassed):
        with deadlines.bounded(3.0, "the lease", since=read_at):
            session.get(peer.url, timeout=5)
    assert not peer.accepted.is_set()


def test_overdue_names_a_thread_stuck_past_its_end():
    inside, release = threading.Event(), threading.Event()

    def stuck() -> None:
        with deadlines.bounded(0.01, "a lookup"):
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    try:
        assert inside.wait(10) and thread.ident is not None
        give_up = time.monotonic() + BOUND
        while (late := deadlines.overdue(thread.ident)) is None:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        assert late.what == "a lookup"
        assert deadlines.overdue(threading.get_ident()) is None
    finally:
        release.set()
        thread.join(10)
    assert deadlines.overdue(thread.ident) is None  # left the block: not overdue


def test_nova_send_ends_at_its_deadline_and_logs_the_outage_once(tmp_path, peer, caplog):
    conf = make_conf(str(tmp_path), nova__auth_type="none", nova__endpoint_override=peer.url,
                     nova__deadline=1.0, nova__timeout=600, nova__connect_retry_delay=0.01)
    notifier = nova.NovaNotifier(conf)
    event = nova.Event(str(uuid.uuid4()), str(uuid.uuid4()), "completed")
    caplog.set_level(logging.DEBUG)
    for _ in range(2):
        outcome, elapsed = _timed(lambda: notifier.send([event]))
        assert outcome == {event.arq_uuid: nova.RETRY}
        assert elapsed < BOUND
    assert outages.process_log().is_down(nova.NOVA)
    down = [r for r in caplog.records if "Nova is unavailable" in r.getMessage()]
    assert len(down) == 1  # once when it started, not per send
    assert [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING] == []


def test_every_keystoneauth_group_has_a_timeout_and_a_deadline(tmp_path):
    conf = make_conf(str(tmp_path))
    assert conf.nova.timeout and conf.placement.timeout and conf.glance.timeout
    assert conf.nova.deadline and conf.placement.deadline


def test_placement_call_ends_at_its_deadline(tmp_path, peer):
    conf = make_conf(str(tmp_path), placement__auth_type="none",
                     placement__endpoint_override=peer.url, placement__deadline=1.0,
                     placement__timeout=600)
    client = pl.from_conf(conf)
    assert client is not None
    error, elapsed = _timed(lambda: client.get_provider(str(uuid.uuid4())))
    assert isinstance(error, pl.PlacementUnavailable), error
    assert "did not answer" in str(error)
    assert elapsed < BOUND


def test_glance_fetch_ends_at_its_deadline(tmp_path, peer):
    conf = make_conf(str(tmp_path), glance__auth_type="none",
                     glance__endpoint_override=peer.url, glance__timeout=600,
                     glance__connect_retries=0)
    source = images.GlanceSource(conf, timeout=1.0)

    def fetch() -> None:
        with source.open(str(uuid.uuid4())):
            pass

    error, elapsed = _timed(fetch)
    assert isinstance(error, images.ImageError) and error.status == 503, error
    assert elapsed < BOUND


def test_an_agent_call_ends_at_its_timeout_as_timed_out(tmp_path, sqlite_db, peer):
    conf = make_conf(str(tmp_path))
    caller = AgentCaller(conf, sqlite_db, secret=b"s" * 32)
    error, elapsed = _timed(lambda: caller.post(
        peer.url, "stall-node", "/attach-handles/prepare", {}, timeout=1.0,
        timeout_message="the agent did not answer in time"))
    assert isinstance(error, AgentCallError), error
    assert (error.status, error.timed_out) == (502, True)
    assert elapsed < BOUND


def test_a_driver_process_hello_ends_at_its_deadline(tmp_path, peer, monkeypatch):
    """A driver process's hello to an agent that stalls: the loop is not held past it."""
    monkeypatch.setattr(hardware, "HELLO_DEADLINE", 1.0)
    conf = make_conf(str(tmp_path))
    loop = hardware.HelloLoop.to_peer(conf, Signer(b"k" * 32, "node"), peer.url,
                                      lambda: {"status": "READY"}, "agent", "agent:node")
    accepted, elapsed = _timed(loop.once)
    assert accepted is False
    assert elapsed < BOUND
