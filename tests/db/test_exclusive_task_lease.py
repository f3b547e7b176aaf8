"""An exclusive periodic task never runs on two conductors at once, even when a pass
outlasts the lease it started under (the lease is renewed while the task runs)."""

from __future__ import annotations

import threading
import time

from acceld.conductor import service
from acceld.conductor.service import Conductor, PeriodicTask


def test_a_task_slower_than_its_lease_never_runs_twice_at_once(conf, sqlite_db, monkeypatch):
    monkeypatch.setattr(service, "LEASE_MIN_SECONDS", 0.4)  # lease 0.4 s; a pass takes 1.2 s
    guard = threading.Lock()
    running: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    passes: list[str] = []

    def task_for(name: str) -> PeriodicTask:
        def run() -> None:
            with guard:
                running.append(name)
                if len(running) > 1:
                    overlaps.append(tuple(running))
            time.sleep(1.2)
            with guard:
                running.remove(name)
                passes.append(name)
        return PeriodicTask("slow-sync", 0.05, run, exclusive=True)

    conductors = [Conductor(conf, sqlite_db, instance_id=f"c{i}") for i in (1, 2)]
    threads = [threading.Thread(target=c._loop, args=(task_for(c.instance_id),), daemon=True)
               for c in conductors]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    for conductor in conductors:
        conductor._stop.set()
    for thread in threads:
        thread.join(timeout=5)
    assert not any(thread.is_alive() for thread in threads)
    assert passes, "the task never ran"
    assert overlaps == []
