"""acceld.db.mdev_handles: one identity for an mdev whatever shape its attach_info has."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from acceld.db.mdev_handles import mdev_identity, pair_by_mdev
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


def row(row_id, info, in_use):  # type: ignore[no-untyped-def]
    return SimpleNamespace(id=row_id, attach_type="MDEV", attach_info=json.dumps(info),
                           in_use=in_use)


def test_pairing_prefers_the_row_in_use_and_skips_a_free_row_with_a_duplicate():
    handle = AttachHandle("MDEV", NEW)
    key = "new"
    in_use, free = row(1, OLD, True), row(2, {**OLD, "note": "x"}, False)
    [pair] = pair_by_mdev([(key, handle)], {"old": in_use, "other": free})
    assert (pair.row.id, pair.duplicate) == (1, None)
    duplicate = row(3, NEW, False)
    [pair] = pair_by_mdev([(key, handle)], {"old": in_use, key: duplicate})
    assert (pair.row.id, pair.duplicate.id) == (1, 3)
    assert pair_by_mdev([(key, handle)], {"free": free, key: duplicate}) == []
    assert pair_by_mdev([(key, handle)], {key: duplicate}) == []  # steady state
