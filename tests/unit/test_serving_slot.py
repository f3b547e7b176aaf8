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
