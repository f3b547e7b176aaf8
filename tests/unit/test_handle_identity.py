"""acceld.db.handle_identity: one identity per attach type, whatever else attach_info holds
(an mdev in either shape, a PCI function whatever keys it gained)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from acceld.db.handle_identity import (handle_identity, mdev_identity, pair_by_identity,
                                      pci_identity, renamed)
from acceld.drivers.base import AttachHandle

MDEV = "62610a56-f227-57ed-9641-d0f9ded18585"
NEW = {"domain": "0000", "bus": "06", "device": "00", "function": "0",
       "asked_type": "nvidia-223", "vgpu_mark": "nvidia-223_0", "uuid": MDEV}
OLD = {"parent": "0000:06:00.0", "asked_type": "nvidia-223", "vgpu_mark": "nvidia-223_0",
       "uuid": MDEV}


def test_both_shapes_name_the_same_mdev():
    assert mdev_identity("MDEV", NEW) == mdev_identity("MDEV", OLD) == ("0000:06:00.0", MDEV)
    assert mdev_identity("MDEV", {**OLD, "uuid": MDEV.upper(), "parent": "0000:06:00.0"}) == (
        "0000:06:00.0", MDEV)


@pytest.mark.parametrize("attach_type, info", [
    ("PCI", NEW),  # only MDEV handles name an mdev
    ("MDEV", {**OLD, "uuid": "not-a-uuid"}),
    ("MDEV", {k: v for k, v in OLD.items() if k != "uuid"}),
    ("MDEV", {**OLD, "parent": "../x"}),
    ("MDEV", {k: v for k, v in NEW.items() if k != "bus"}),
    ("MDEV", {k: v for k, v in OLD.items() if k != "parent"}),
])
def test_no_identity_without_a_valid_parent_and_uuid(attach_type, info):
    assert mdev_identity(attach_type, info) is None


def row(row_id, info, in_use, attach_type="MDEV"):  # type: ignore[no-untyped-def]
    return SimpleNamespace(id=row_id, attach_type=attach_type, attach_info=json.dumps(info),
                           in_use=in_use)


def test_pairing_prefers_the_row_in_use_and_skips_a_free_row_with_a_duplicate():
    handle = AttachHandle("MDEV", NEW)
    key = "new"
    in_use, free = row(1, OLD, True), row(2, {**OLD, "note": "x"}, False)
    [pair] = pair_by_identity([(key, handle)], {"old": in_use, "other": free})
    assert (pair.row.id, pair.duplicate) == (1, None)
    duplicate = row(3, NEW, False)
    [pair] = pair_by_identity([(key, handle)], {"old": in_use, key: duplicate})
    assert (pair.row.id, pair.duplicate.id) == (1, 3)
    assert pair_by_identity([(key, handle)], {"free": free, key: duplicate}) == []
    assert pair_by_identity([(key, handle)], {key: duplicate}) == []  # steady state


VF = {"domain": "0000", "bus": "5e", "device": "02", "function": "1"}


def test_a_pci_function_is_its_address_whatever_else_the_info_says():
    assert pci_identity("PCI", VF) == "0000:5e:02.1"
    assert pci_identity("PCI", {**VF, "physical_network": "physnet2"}) == "0000:5e:02.1"
    assert pci_identity("TEST_PCI", {"domain": "0", "bus": "5E", "device": "2",
                                     "function": "1"}) == "0000:5e:02.1"
    assert handle_identity("PCI", VF) == ("PCI", "0000:5e:02.1")
    assert handle_identity("TEST_PCI", VF) == ("TEST_PCI", "0000:5e:02.1")  # not the same
    assert handle_identity("MDEV", NEW) == ("MDEV", ("0000:06:00.0", MDEV))


@pytest.mark.parametrize("attach_type, info", [
    ("MDEV", VF),  # an MDEV handle is its mdev, not its parent
    ("PCI", {k: v for k, v in VF.items() if k != "function"}),
    ("PCI", {**VF, "function": "8"}),
    ("PCI", {**VF, "bus": "5e0"}),
    ("PCI", {**VF, "domain": "0x00"}),
    ("PCI", {**VF, "device": 2}),
    ("OTHER", VF),
])
def test_no_pci_identity_without_a_valid_address(attach_type, info):
    assert pci_identity(attach_type, info) is None
    if attach_type != "MDEV":
        assert handle_identity(attach_type, info) is None


def test_a_pci_row_pairs_with_the_same_function_reported_with_a_key_added():
    handle = AttachHandle("PCI", {**VF, "physical_network": "physnet2"})
    other = AttachHandle("PCI", {**VF, "function": "0", "physical_network": "physnet2"})
    stored = {"vf1": row(1, VF, True, "PCI"), "vf0": row(2, {**VF, "function": "0"}, False,
                                                         "PCI")}
    reported = [("new1", handle), ("new0", other)]
    assert renamed(reported, stored)
    pairs = pair_by_identity(reported, stored)
    assert [(p.key, p.row.id, p.duplicate) for p in pairs] == [("new1", 1, None),
                                                               ("new0", 2, None)]
    # Another attach type at the same address, or another function, is not the same handle.
    assert not renamed([("t", AttachHandle("TEST_PCI", VF))], {"vf1": row(1, VF, True, "PCI")})
    assert not renamed([("new1", handle)], {"vf0": row(2, {**VF, "function": "0"}, True, "PCI")})
    assert not renamed([("vf1", AttachHandle("PCI", VF))], {"vf1": row(1, VF, True, "PCI")})


def test_renamed_sees_a_split_whichever_row_is_in_use():
    """The inventory re-reads the rows when renamed() is true; pair_by_identity decides."""
    handle = AttachHandle("PCI", {**VF, "physical_network": "physnet2"})
    old, duplicate = row(1, VF, False, "PCI"), row(2, handle.attach_info, False, "PCI")
    assert renamed([("new", handle)], {"old": old, "new": duplicate})
    assert pair_by_identity([("new", handle)], {"old": old, "new": duplicate}) == []
    [pair] = pair_by_identity([("new", handle)],
                              {"old": row(1, VF, True, "PCI"), "new": duplicate})
    assert (pair.row.id, pair.duplicate.id) == (1, 2)
