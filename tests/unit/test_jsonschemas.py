"""Schemas acceld compiles refuse a trailing newline where ``$`` anchors a pattern.

Python's ``re.search`` lets ``$`` match before a final newline; JSON Schema (ECMA-262)
does not. The published hardware-record schema keeps ``$``; acceld compiles it with ``\\Z``.
"""

from __future__ import annotations

import pytest

from acceld.agent.service import DRIVER_HELLO
from acceld.conductor.fleet.agents import HELLO_SCHEMA
from acceld.drivers import loader, record_schema
from acceld.jsonschemas import python_anchored, strict_validator
from tests.conftest import make_conf


@pytest.mark.parametrize("given, expected", [
    ("^[A-Z]+$", r"^[A-Z]+\Z"),
    (r"^a\$", r"^a\$"),            # an escaped dollar is a character, not an anchor
    (r"^a\\$", r"^a\\\Z"),         # an escaped backslash, then the anchor
    ("^a$|^b", "^a$|^b"),          # only a final anchor is rewritten
    ("^ab", "^ab"),
])
def test_python_anchored(given: str, expected: str) -> None:
    assert python_anchored(given) == expected


def test_the_compiled_schema_refuses_what_the_published_one_keeps() -> None:
    schema = {"type": "object", "properties": {"t": {"type": "string", "pattern": "^[A-Z]+$"}},
              "additionalProperties": False,
              "patternProperties": {"^x[0-9]+$": {"type": "integer"}}}
    validator = strict_validator(schema)
    assert validator.is_valid({"t": "ABC", "x1": 1})
    assert not validator.is_valid({"t": "ABC\n"})
    assert not validator.is_valid({"x1\n": 1})  # no longer a pattern property: refused
    assert schema["properties"]["t"]["pattern"] == "^[A-Z]+$"


@pytest.mark.parametrize("field", ["hostname", "endpoint"])
def test_conductor_hello_refuses_a_trailing_newline(field: str) -> None:
    hello = {"status": "READY", "endpoint": "127.0.0.1:6668", "hostname": "node1"}
    assert HELLO_SCHEMA.is_valid(hello)
    assert not HELLO_SCHEMA.is_valid({**hello, field: hello[field] + "\n"})


def test_driver_hello_refuses_a_trailing_newline() -> None:
    hello = {"status": "READY", "endpoint": "127.0.0.1:7000", "type": "FPGA"}
    assert DRIVER_HELLO.is_valid(hello)
    assert not DRIVER_HELLO.is_valid({**hello, "endpoint": "127.0.0.1:7000\n"})


def test_hardware_records_refuse_a_trailing_newline_in_a_trait(tmp_path) -> None:
    conf = make_conf(str(tmp_path))
    record = loader.load("fake", conf, "node1").discover()[0].to_dict()
    assert record_schema.check_node([record]).problems == []
    attributes = record["deployables"][0]["attributes"]
    trait = next(k for k in attributes if k.startswith("trait"))
    attributes[trait] += "\n"
    assert record_schema.check_node([record]).problems != []
