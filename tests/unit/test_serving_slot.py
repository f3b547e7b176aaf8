"""acceld.serving.serving_slot: one holder at a time; stepping out hands the slot on and takes it
back, ahead of threads that want to poll; outside a holder, stepping out does nothing."""

from __future__ import annotations

import threading

from acceld.serving import serving_slot


def test_stepping_out_without_a_slot_does_nothing():
    assert not serving_slot.holds_slot()
    with serving_slot.stepped_out():
        assert not serving_slot.holds_slot()
    assert not serving_slot.holds_slot()


def test_a_thread_stepped_out_lets_another_hold_the_slot_then_takes_it_back():
    slot = serving_slot.Slot()
    stepped_out, other_done, back = threading.Event(), threading.Event(), []

    def holder() -> None:
        with slot.held():
            with serving_slot.stepped_out():
                assert not serving_slot.holds_slot()
                stepped_out.set()
                assert other_done.wait(5)
            back.append(serving_slot.holds_slot())

    thread = threading.Thread(target=holder)
    thread.start()
    assert stepped_out.wait(5)
    with slot.held():  # free while the holder is stepped out
        assert serving_slot.holds_slot()
    other_done.set()
    thread.join(5)
    assert back == [True]
    assert not serving_slot.holds_slot()


def test_stepping_out_twice_nests():
    slot = serving_slot.Slot()
    with slot.held():
        with serving_slot.stepped_out():
            with serving_slot.stepped_out():  # nothing held: nothing to give up
                pass
            assert not serving_slot.holds_slot()
        assert serving_slot.holds_slot()


def test_the_slot_is_taken_back_when_the_wait_raises():
    slot = serving_slot.Slot()
    with slot.held():
        try:
            with serving_slot.stepped_out():
                raise TimeoutError("the conductor did not answer")
        except TimeoutError:
            pass
        assert serving_slot.holds_slot()


def test_a_thread_back_from_a_wait_goes_before_those_that_want_to_poll():
    slot = serving_slot.Slot()
    wanted = threading.Event()
    slot.on_wanted = wanted.set  # the loop wakes its idle holder this way
    order: list[str] = []
    stepped_out, go_back = threading.Event(), threading.Event()

    def waiter() -> None:
        with slot.held():
            with serving_slot.stepped_out():
                stepped_out.set()
                assert go_back.wait(5)
            order.append("returner")

    def poller() -> None:
        with slot.held():
            order.append("poller")

    first = threading.Thread(target=waiter)
    first.start()
    assert stepped_out.wait(5)
    slot.take()  # the holder now (as the loop's next thread)
    go_back.set()
    assert wanted.wait(5)  # the returner asked while the slot was held
    assert slot.wanted()
    second = threading.Thread(target=poller)
    second.start()  # wants to poll: must wait behind the returner
    slot.give()
    first.join(5)
    second.join(5)
    assert order == ["returner", "poller"]


def test_a_closed_slot_lets_every_waiter_go_on():
    slot = serving_slot.Slot()
    slot.take()
    went_on = threading.Event()

    def waiter() -> None:
        slot.take()
        went_on.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    slot.close()
    assert went_on.wait(5)
    thread.join(5)


def _poller(slot: serving_slot.Slot, got: threading.Event, done: threading.Event,
            held: list[bool]) -> threading.Thread:
    """A sleeping thread that wants the slot (as a loop thread does), holds it until
    ``done``, then gives it back."""

    def run() -> None:
        slot.take()
        held.append(serving_slot.holds_slot())
        got.set()
        assert done.wait(5)
        slot.give()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_blocking_call_that_returns_at_once_keeps_the_slot():
    slot = serving_slot.Slot(hand_off_after=5.0)
    got, done, held = threading.Event(), threading.Event(), []
    with slot.held():
        other = _poller(slot, got, done, held)
        with serving_slot.blocking():  # a statement that did not wait
            pass
        assert serving_slot.holds_slot() and not got.is_set()
    assert got.wait(5)  # given at the end of the hold, not before
    done.set()
    other.join(5)
    assert held == [True]


def test_a_blocking_call_that_runs_long_loses_the_slot_and_takes_it_back():
    slot = serving_slot.Slot(hand_off_after=0.05)
    got, done, held = threading.Event(), threading.Event(), []
    after: list[bool] = []
    with slot.held():
        other = _poller(slot, got, done, held)
        with serving_slot.blocking():  # a statement waiting for a lock
            assert got.wait(5), "the sleeping thread never took the slot over"
            assert not serving_slot.holds_slot()  # it is the other thread's now
            done.set()  # the other thread serves, then gives the slot back
        after.append(serving_slot.holds_slot())  # taken back before going on
    other.join(5)
    assert held == [True] and after == [True]


def test_stepping_out_inside_a_blocking_call_that_lost_the_slot_keeps_the_new_holders():
    slot = serving_slot.Slot(hand_off_after=0.05)
    got, done, held = threading.Event(), threading.Event(), []
    with slot.held():
        other = _poller(slot, got, done, held)
        with serving_slot.blocking():  # a token check...
            assert got.wait(5)
            with serving_slot.stepped_out():  # ...that then calls Keystone
                assert slot._held  # still the other thread's: stepping out did not free it
                done.set()
            assert serving_slot.holds_slot()
    other.join(5)
    assert held == [True]

