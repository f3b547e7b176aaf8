"""A trait is matched by its value, not its key's number: rows imported from upstream Cyborg
keep upstream's keys (its fake driver writes ``traits1``), and the first report of acceld's
driver for the same hardware changes nothing (acceld.db.inventory._sync_attributes)."""

from __future__ import annotations

from sqlalchemy import select, update

from acceld.conductor.reconcile import apply_report
from acceld.db.models import attributes
from acceld.drivers import loader
from tests.conftest import make_conf

HOST = "cn-traits"


def _report(tmp_path) -> dict:
    conf = make_conf(str(tmp_path), host=HOST)
    return {"hardware": [r.to_dict() for r in loader.load("fake", conf, HOST).discover()],
            "digest": None}


def _attrs(db) -> dict[str, tuple]:
    with db.read() as conn:
        return {r.key: (r.uuid, r.value, r.operator_owned) for r in conn.execute(
            select(attributes))}


def test_a_trait_under_upstreams_key_is_kept(db, tmp_path) -> None:
    apply_report(db, HOST, _report(tmp_path))
    with db.write() as conn:  # as an import from upstream leaves it
        conn.execute(update(attributes).where(attributes.c.key == "trait0").values(
            key="traits1"))
    imported = _attrs(db)
    outcome = apply_report(db, HOST, _report(tmp_path))
    assert (outcome.changes.added, outcome.changes.updated, outcome.changes.removed) == (0, 0, 0)
    assert _attrs(db) == imported


def test_an_operators_attribute_of_that_value_is_not_taken(db, tmp_path) -> None:
    apply_report(db, HOST, _report(tmp_path))
    with db.write() as conn:
        conn.execute(update(attributes).where(attributes.c.key == "trait0").values(
            key="traits1", operator_owned=True))
    apply_report(db, HOST, _report(tmp_path))
    held = _attrs(db)
    assert held["trait0"][1] == "CUSTOM_FAKE_DEVICE" and not held["trait0"][2]
    assert held["traits1"][1:] == ("CUSTOM_FAKE_DEVICE", True)  # the operator's, kept
