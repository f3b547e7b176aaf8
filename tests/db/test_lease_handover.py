"""A conductor that stops gracefully gives its exclusive leases back at once, so another
conductor takes the task over without waiting for the lease to lapse; one whose pass is
still running when it stops keeps the lease (the pass may still be writing). Every backend."""

from __future__ import annotations

import threading

from acceld.conductor import service
from acceld.conductor.service import Conductor, PeriodicTask
from acceld.db import leases


def start_task(conductor: Conductor, task: PeriodicTask) -> threading.Thread:
    thread = threading.Thread(target=conductor._loop, args=(task,), daemon=True)
    thread.start()
    conductor._threads.append(thread)
    return thread


def test_a_graceful_stop_gives_the_lease_back(conf, db):
    ran = threading.Event()
    c1 = Conductor(conf, db, instance_id="c1")
    start_task(c1, PeriodicTask("sync", 0.05, ran.set, exclusive=True))
    assert ran.wait(10)
    assert not leases.acquire(db, "sync", "c2", 30)  # held (for 10 s at least)
    c1.stop()
    assert leases.acquire(db, "sync", "c2", 30)  # at once, not after the lease


def test_a_pass_still_running_at_stop_keeps_its_lease(conf, db, monkeypatch):
    monkeypatch.setattr(service, "STOP_WAIT", 0.2)
    inside, finish = threading.Event(), threading.Event()

    def run() -> None:
        inside.set()
        finish.wait(10)

    c1 = Conductor(conf, db, instance_id="c1")
    thread = start_task(c1, PeriodicTask("sync", 0.05, run, exclusive=True))
    assert inside.wait(10)
    c1.stop()  # waits STOP_WAIT for the pass, which goes on
    assert thread.is_alive()
    assert not leases.acquire(db, "sync", "c2", 30)
    finish.set()
    thread.join(10)
    assert leases.acquire(db, "sync", "c2", 30)  # given back once the pass ended
