"""Wake-ups of the bind workers and waits for the binds they resolve
(acceld.conductor.binding.wakes)."""

from __future__ import annotations

import threading

from acceld.conductor.binding.wakes import ResolvedWatch, WakeCalls


def test_each_wake_lets_one_worker_go_and_none_is_lost() -> None:
    wakes = WakeCalls(workers=4)
    wakes.wake()
    assert wakes.wait()  # the one wake-up
    for _ in range(6):  # while every worker was busy: kept, one per worker at most
        wakes.wake()
    assert [wakes.wait() for _ in range(4)] == [True] * 4
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(wakes.wait()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not done  # no wake-up left for a fifth
    wakes.close()
    waiter.join(5)
    assert done == [False]  # closing lets the waiting workers go, with nothing to do


def test_one_wake_runs_one_workers_pass(monkeypatch, tmp_path, sqlite_db) -> None:
    """Four workers, one wake: one pass (an Event woke all four, each claiming for nothing)."""
    from acceld.conductor.binding.worker import BindingComponent
    from tests.conftest import make_conf

    conf = make_conf(str(tmp_path), conductor__bind_workers=4)
    component = BindingComponent(conf, sqlite_db)
    passes: list[str] = []
    first = threading.Event()

    def run_pass() -> tuple[int, bool]:
        passes.append(threading.current_thread().name)
        first.set()
        return 0, False

    monkeypatch.setattr(component.worker, "run_pass", run_pass)
    component.start()  # its own wake-up: one pass for jobs left by a previous run
    try:
        assert first.wait(5)
        first.clear()
        component.wakes.wake()
        assert first.wait(5)
    finally:
        component.stop()  # the workers that had no wake-up leave without a pass
    assert len(passes) == 2, passes


def test_a_wait_ends_when_every_arq_is_resolved() -> None:
    watch = ResolvedWatch()
    started = threading.Event()
    result: list[int] = []

    def announce_later() -> None:
        started.set()

    waiter = threading.Thread(target=lambda: result.append(
        watch.wait([1, 2], 30.0, announce_later)))
    waiter.start()
    assert started.wait(5)  # the watch is set before the wake goes out
    watch.announce(1)
    watch.announce(7)  # nobody waits for it: not kept
    waiter.join(0.2)
    assert waiter.is_alive()  # 2 is not resolved yet
    watch.announce(2)
    waiter.join(5)
    assert result == [2]
    assert not watch._waiting and not watch._resolved  # nothing left behind


def test_a_wait_that_runs_out_says_how_many_were_resolved() -> None:
    watch = ResolvedWatch()
    assert watch.wait([1, 2], 0.05, lambda: watch.announce(1)) == 1
    assert watch.wait([3], 0.0) == 0
    assert not watch._waiting and not watch._resolved


def test_two_waits_for_one_arq_both_see_it() -> None:
    watch = ResolvedWatch()
    entered = threading.Barrier(3)
    results: list[int] = []

    def wait() -> None:
        results.append(watch.wait([5], 30.0, lambda: entered.wait(5)))

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait(5)  # both watch 5
    watch.announce(5)
    for thread in threads:
        thread.join(5)
    assert results == [1, 1]
    assert not watch._waiting and not watch._resolved
