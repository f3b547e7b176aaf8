"""The compiled record check never passes what jsonschema refuses (acceld.drivers.record_schema).

Records are the fake driver's, valid, with one value somewhere inside replaced by a
near miss (wrong type, bool for integer, trailing newline, too long, extra key, ...), so
that the documents reach every keyword of the schema rather than failing at the top.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceld.drivers import record_schema
from acceld.drivers.fake import TYPES, FakeDriver
from tests.conftest import make_conf

NEAR_MISSES: list[Any] = [
    None, True, False, 0, -1, 1.0, 1.5, 2**31, "", "x", "X\n", "0000\n", "ready\n",
    "a" * 65, "A" * 256, "CUSTOM_A", "CUSTOM_A\n", "PCI", "MDEV", "healthy", "bogus",
    "12345678-1234-1234-1234-123456789abc\n", [], [{}], {}, {"k": 1}, {"k": "v"},
    {"setup_required": True}, {"setup_required": 1}, {"state": "healthy"},
    {"state": "healthy", "counters": {"a": True}}, {"state": "healthy", "counters": {"a\n": 1}},
    {"domain": "0000", "bus": "0a", "device": "00", "function": "8"},
]
EXTRA_KEYS = ["extra", "trait1\n", "trait01", "rc", "a b", "x" * 256]


def _records() -> list[dict[str, Any]]:
    conf = make_conf("/tmp")
    conf.set_override("devices", list(TYPES), group="fake_driver")
    conf.set_override("attach_handles", 2, group="fake_driver")
    records = []
    for record in FakeDriver(conf, "node-1").discover():
        as_dict = record.to_dict()
        as_dict["health"] = {"state": "healthy", "reason": None, "counters": {"errors": 0}}
        records.append(as_dict)
    # An MDEV handle too: the schema's if/then treats it apart from PCI ones.
    records[0]["deployables"][0]["attach_handles"].append(
        {"attach_type": "MDEV", "attach_info": {"uuid": "12345678-1234-1234-1234-123456789abc",
                                                 "parent": "0000:0a:00.0"}})
    return records


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, prefix + (index,))
    return found


RECORDS = _records()
TARGETS = [(i, path) for i, record in enumerate(RECORDS) for path in _paths(record)]


def _mutated(target: tuple[int, tuple], value: Any, extra: str | None) -> dict[str, Any]:
    index, path = target
    record = copy.deepcopy(RECORDS[index])
    if not path:
        return value if extra is None else record
    parent = record
    for step in path[:-1]:
        parent = parent[step]
    if extra is not None and isinstance(parent, dict):
        parent[extra] = value
    else:
        parent[path[-1]] = value
    return record


def test_valid_records_pass_both():
    for record in RECORDS:
        assert record_schema.fast_passes(record)
        assert next(iter(record_schema.VALIDATOR.iter_errors(record)), None) is None


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(TARGETS), st.sampled_from(NEAR_MISSES),
       st.none() | st.sampled_from(EXTRA_KEYS))
def test_fast_check_passes_nothing_jsonschema_refuses(target, value, extra):
    record = _mutated(target, value, extra)
    if record_schema.fast_passes(record):
        assert next(iter(record_schema.VALIDATOR.iter_errors(record)), None) is None


def test_refused_records_are_worded_by_jsonschema():
    record = copy.deepcopy(RECORDS[0])
    record["deployables"][0]["num_accelerators"] = True
    assert not record_schema.fast_passes(record)
    checked = record_schema.check_node([record])
    assert checked.records == []
    assert checked.problems[0].message.startswith("at 'deployables/0/num_accelerators'")
