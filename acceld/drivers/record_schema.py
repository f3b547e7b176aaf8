"""The hardware record's JSON schema, and the check every record passes on receipt.

One schema for in-process and external drivers alike: the conductor checks
each record of a node's ``GET /hardware`` answer against it before the
inventory sees it. A bad record is refused on its own (the others of the
node still count). ``docs/hardware-record.schema.json`` is this schema as a
file (``python -m acceld.drivers.record_schema > docs/hardware-record.schema.json``
writes it; a test keeps the two equal).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import fastjsonschema
import orjson

from acceld.drivers.base import ACC_STATUSES, ATTACH_TYPES, DEVICE_TYPES, HardwareRecord
from acceld.drivers.health import SCHEMA as HEALTH_SCHEMA
from acceld.jsonschemas import strict_validator

_UUID = "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 64}}
_PCI_PARTS = {
    "type": "object",
    "required": ["domain", "bus", "device", "function"],
    "properties": {
        "domain": {"type": "string", "pattern": "^[0-9a-fA-F]{1,4}$"},
        "bus": {"type": "string", "pattern": "^[0-9a-fA-F]{1,2}$"},
        "device": {"type": "string", "pattern": "^[0-9a-fA-F]{1,2}$"},
        "function": {"type": "string", "pattern": "^[0-7]$"},
    },
}
_TRAIT = {"type": "string", "pattern": "^[A-Z0-9_]{1,255}$"}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://acceld.invalid/schemas/hardware-record.schema.json",
    "title": "acceld hardware record",
    "description": (
        "One piece of hardware on a node, as a driver reports it in GET /hardware "
        "({\"hardware\": [record, ...]}). The seed's fields (uuid, acc_specs, acc_status) "
        "plus what the inventory needs: the device (type, vendor, model, board info, "
        "control path) and its deployables with attributes and attach handles."),
    "type": "object",
    "additionalProperties": False,
    "required": ["uuid", "type", "vendor", "model", "driver_name", "controlpath_id"],
    "properties": {
        "uuid": {"type": "string", "pattern": _UUID,
                 "description": "Stable id of the hardware; the device's uuid when first seen."},
        "type": {"enum": list(DEVICE_TYPES)},
        "vendor": {"type": "string", "minLength": 1, "maxLength": 255,
                   "description": "PCI vendor id, e.g. 0x10de."},
        "model": {"type": "string", "minLength": 1, "maxLength": 255},
        "driver_name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,100}$"},
        "controlpath_id": {
            "type": "object",
            "additionalProperties": False,
            "required": ["cpid_type", "cpid_info"],
            "description": "How the host reaches the device; devices are matched by it.",
            "properties": {
                "cpid_type": {"enum": ["PCI"]},
                "cpid_info": {**_PCI_PARTS, **{"additionalProperties":
                                               {"type": "string", "maxLength": 64}}},
            },
        },
        "acc_specs": {"type": "object",
                      "description": "The seed's free-form capabilities (remote, num, ...)."},
        "acc_status": {
            "description": ("ready, setup_required or reboot_required; or the seed's object "
                            "form. Hardware not ready is recorded but not offered."),
            "oneOf": [
                {"enum": list(ACC_STATUSES)},
                {"type": "object",
                 "additionalProperties": False,
                 "properties": {"setup_required": {"type": "boolean"},
                                "reboot_required": {"type": "boolean"},
                                "reboot_equired": {"type": "boolean"}}},
            ],
        },
        "status_reason": {"type": ["string", "null"], "maxLength": 1000,
                          "description": "Why the hardware is not ready, in words."},
        "health": HEALTH_SCHEMA,
        "std_board_info": {"type": "object"},
        "vendor_board_info": {"type": ["object", "string"]},
        "deployables": {
            "type": "array",
            "maxItems": 256,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "num_accelerators", "attributes"],
                "properties": {
                    "name": {"type": "string",
                             "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$",
                             "description": "Local to the node; stored as <hostname>_<name>."},
                    "num_accelerators": {"type": "integer", "minimum": 0, "maximum": 100000},
                    "attributes": {
                        "type": "object",
                        "required": ["rc"],
                        "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,255}$"},
                        "properties": {"rc": {"type": "string",
                                              "pattern": "^[A-Z0-9_]{1,255}$"}},
                        "patternProperties": {"^trait[0-9]+$": _TRAIT},
                        "additionalProperties": {"type": "string", "maxLength": 255},
                    },
                    "attach_handles": {
                        "type": "array",
                        "maxItems": 4096,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["attach_type", "attach_info"],
                            "properties": {
                                "attach_type": {"enum": list(ATTACH_TYPES)},
                                "attach_info": _STR_MAP,
                                "in_use": {"type": "boolean",
                                           "description": "Ignored: the inventory decides."},
                            },
                            "if": {"properties": {"attach_type": {"enum": ["PCI", "TEST_PCI"]}}},
                            "then": {"properties": {"attach_info": _PCI_PARTS}},
                        },
                    },
                    "bitstream_id": {"type": ["string", "null"], "pattern": _UUID},
                },
            },
        },
    },
}

VALIDATOR = strict_validator(SCHEMA)


def _compile_fast_check() -> Any:
    """The record schema compiled to straight-line Python (fastjsonschema, draft 7).

    jsonschema walked the schema for each record (~4 ms of conductor CPU per node of 8
    devices, most of a registration). The compiled check only ever *passes* a record; one
    it refuses goes to jsonschema, which decides and words the problem, so the conductor's
    answers stay jsonschema's. Every keyword this schema uses means the same in draft 7 and
    2020-12 (type, properties, required, additionalProperties, patternProperties,
    propertyNames, items as a schema, enum of strings, oneOf, if/then, min/max*, pattern);
    the patterns are the strict ones (``\\Z``). tests/unit/test_record_schema_fast.py
    checks that it passes nothing jsonschema refuses.
    """
    schema = {k: v for k, v in VALIDATOR.schema.items() if k not in ("$schema", "$id")}
    return fastjsonschema.compile({"$schema": "http://json-schema.org/draft-07/schema#",
                                   **schema})


_FAST_CHECK = _compile_fast_check()
_MAX_JSON_TEXT = 255  # controlpath_ids.cpid_info and attach_handles.attach_info columns


@dataclass
class Problem:
    """Why one record was refused, and enough of it to keep its old rows."""

    index: int
    message: str
    driver_name: str | None


@dataclass
class Checked:
    records: list[HardwareRecord]
    problems: list[Problem]


def fast_passes(item: Any) -> bool:
    """True only when the compiled check accepts ``item``; False means 'ask jsonschema'."""
    try:
        _FAST_CHECK(item)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def _first_error(item: Any) -> str | None:
    if fast_passes(item):
        return None
    error = next(iter(VALIDATOR.iter_errors(item)), None)
    if error is None:
        return None
    while error.context:
        error = min(error.context, key=lambda e: (-len(e.absolute_path), e.message))
    where = "/".join(str(p) for p in error.absolute_path)
    return f"at '{where}': {error.message}" if where else error.message


def json_text(value: dict[str, Any]) -> str:
    """How cpid_info and attach_info are stored (and compared): JSON text, keys as given."""
    return orjson.dumps(value).decode()


def identity(value: dict[str, Any]) -> str:
    """Order-independent identity of an info dict, for matching."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def check_node(items: Any) -> Checked:
    """Check a node's records: the schema, then what spans records (unique names, paths)."""
    if not isinstance(items, list):
        return Checked([], [Problem(-1, "'hardware' must be a list of records", None)])
    records: list[HardwareRecord] = []
    problems: list[Problem] = []
    seen_paths: set[str] = set()
    seen_names: set[str] = set()
    for index, item in enumerate(items):
        driver = item.get("driver_name") if isinstance(item, dict) else None
        driver = driver if isinstance(driver, str) else None
        message = _first_error(item) or _semantic_error(item, seen_paths, seen_names)
        if message:
            problems.append(Problem(index, message, driver))
            continue
        records.append(HardwareRecord.from_dict(item))
    return Checked(records, problems)


def _semantic_error(item: dict[str, Any], seen_paths: set[str],
                    seen_names: set[str]) -> str | None:
    cpid = item["controlpath_id"]
    if len(json_text(cpid["cpid_info"])) > _MAX_JSON_TEXT:
        return "at 'controlpath_id/cpid_info': too long"
    path = cpid["cpid_type"] + identity(cpid["cpid_info"])
    if path in seen_paths:
        return "at 'controlpath_id': another record of this node has the same control path"
    names = [d["name"] for d in item.get("deployables", [])]
    if len(set(names)) != len(names) or seen_names.intersection(names):
        return "at 'deployables': a deployable name is used twice on this node"
    for d_index, dep in enumerate(item.get("deployables", [])):
        infos = set()
        for h_index, handle in enumerate(dep.get("attach_handles", [])):
            where = f"deployables/{d_index}/attach_handles/{h_index}/attach_info"
            if len(json_text(handle["attach_info"])) > _MAX_JSON_TEXT:
                return f"at '{where}': too long"
            key = handle["attach_type"] + identity(handle["attach_info"])
            if key in infos:
                return f"at '{where}': the same attach handle is listed twice"
            infos.add(key)
    seen_paths.add(path)
    seen_names.update(names)
    return None


def document() -> str:
    """The schema as the file in docs/ holds it."""
    return orjson.dumps(SCHEMA, option=orjson.OPT_INDENT_2).decode() + "\n"


if __name__ == "__main__":
    sys.stdout.write(document())
