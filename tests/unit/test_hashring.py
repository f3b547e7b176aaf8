"""The conductors' hash ring: the same owner everywhere, even shares, minimal movement."""

from __future__ import annotations

from collections import Counter

from acceld.conductor.fleet.hashring import HashRing

HOSTS = [f"compute-{i:05d}" for i in range(10000)]


def owners(ring: HashRing) -> dict[str, str | None]:
    return {host: ring.owner(host) for host in HOSTS}


def test_every_process_computes_the_same_owner_whatever_the_order_of_members():
    assert owners(HashRing(["c1", "c2", "c3"])) == owners(HashRing(["c3", "c1", "c2", "c1"]))


def test_an_empty_ring_owns_nothing_and_one_member_owns_everything():
    assert HashRing([]).owner("compute-1") is None
    assert set(owners(HashRing(["alone"])).values()) == {"alone"}


def test_shares_are_balanced():
    for members in (["c1", "c2"], ["c1", "c2", "c3"], [f"cond-{i}" for i in range(5)]):
        shares = Counter(owners(HashRing(members)).values())
        even = len(HOSTS) / len(members)
        assert set(shares) == set(members)
        assert max(abs(count - even) / even for count in shares.values()) < 0.2, shares


def test_a_member_joining_takes_hosts_only_from_the_others_and_about_its_share():
    before = owners(HashRing(["c1", "c2", "c3"]))
    after = owners(HashRing(["c1", "c2", "c3", "c4"]))
    moved = [h for h in HOSTS if before[h] != after[h]]
    assert all(after[h] == "c4" for h in moved)  # nothing moves between the old members
    assert 0.15 < len(moved) / len(HOSTS) < 0.35  # about 1/4


def test_a_member_leaving_gives_away_only_its_own_hosts():
    before = owners(HashRing(["c1", "c2", "c3"]))
    after = owners(HashRing(["c1", "c3"]))
    moved = {h for h in HOSTS if before[h] != after[h]}
    assert moved == {h for h in HOSTS if before[h] == "c2"}
    assert Counter(after[h] for h in moved).keys() == {"c1", "c3"}  # spread, not dumped
