"""The in-process replay guard (agents, driver processes, and the conductor's first check):
a nonce is refused for as long as its credential could be accepted, and forgotten after."""

from __future__ import annotations

from acceld.internal.auth import MemoryReplay

NOW = 1_800_000_000


def test_a_nonce_is_refused_while_its_credential_is_live_and_forgotten_after():
    guard = MemoryReplay(60)
    assert guard.first_use("a", NOW, NOW)
    for i in range(10_000):  # many others meanwhile
        assert guard.first_use(f"n{i}", NOW + 30, NOW + 30)
    assert not guard.first_use("a", NOW, NOW + 60)  # still within the ttl of its stamp
    assert guard.first_use("b", NOW + 61, NOW + 61)  # "a" is past its ttl: forgotten
    assert len(guard._seen) == 10_001  # "a" gone; the others (stamped NOW + 30) kept


def test_stamps_out_of_order_are_kept_until_their_own_expiry():
    guard = MemoryReplay(60)
    assert guard.first_use("ahead", NOW + 50, NOW)  # a client whose clock runs ahead
    assert guard.first_use("behind", NOW - 50, NOW)  # queued behind a newer stamp
    assert not guard.first_use("behind", NOW - 50, NOW + 5)
    assert not guard.first_use("ahead", NOW + 50, NOW + 100)
    assert guard.first_use("later", NOW + 111, NOW + 111)  # both past their ttl
    assert guard._seen == {"later"}


def test_a_margin_keeps_nonces_one_more_window():
    guard = MemoryReplay(60, margin=60)
    assert guard.first_use("a", NOW, NOW)
    assert not guard.first_use("a", NOW, NOW + 100)  # past its expiry, within the margin
    assert guard.first_use("b", NOW + 121, NOW + 121)
    assert "a" not in guard._seen


def test_a_client_signs_only_for_a_conductor_process_name():
    from acceld.internal import auth

    assert auth.is_conductor_instance(auth.new_conductor_instance())
    for name in (None, "", "conductor", "agent node-a", "driver 10.0.0.1:1",
                 "conductor " + "0" * 31, "conductor " + "0" * 32 + "\n"):
        assert not auth.is_conductor_instance(name)
    assert auth.new_conductor_instance() != auth.new_conductor_instance()
