"""acceld.serving_slot: one holder at a time; stepping out hands the slot on and takes it
back; outside a holder, stepping out does nothing."""

from __future__ import annotations

import threading

from acceld import serving_slot


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
