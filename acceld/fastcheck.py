"""A compiled fast path in front of jsonschema for request validation.

jsonschema walks a schema for every document (about 40 us for a device
profile), which was a sixth of a whole create request. fastjsonschema compiles
a schema into straight-line Python once. It only ever *passes* documents: a
document it does not pass goes to jsonschema, which decides and words the 400.
So acceld's answers stay jsonschema's, provided that whatever fastjsonschema
passes jsonschema passes too. That holds for the keywords below, whose meaning
is the same in draft 7 (what fastjsonschema implements) and draft 2020-12 (what
acceld's schemas are written in); a schema using any other keyword, or an
enum/const that is not all strings (Python's True == 1 would blur them), gets
no fast path. tests/unit/test_fastcheck.py checks the implication on generated
documents for every schema acceld has.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import fastjsonschema
from jsonschema import Draft202012Validator, ValidationError

# Same meaning in draft 7 and 2020-12 (array-form "items" and "$ref" are not).
SAFE_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "patternProperties",
    "items", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern",
    "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minProperties", "maxProperties", "oneOf", "anyOf", "allOf", "not",
    "title", "description",
})
_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_LISTS = ("oneOf", "anyOf", "allOf")

Check = Callable[[Any], Any]
_checks: dict[int, tuple[Draft202012Validator, Check | None]] = {}
_lock = threading.Lock()


def compilable(schema: Any) -> bool:
    """True when every keyword in ``schema`` (recursively) means the same in both drafts."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= SAFE_KEYWORDS:
        return False
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            if not all(isinstance(v, str) for v in values):
                return False
    for key in _SCHEMA_MAPS:
        if not all(compilable(s) for s in schema.get(key, {}).values()):
            return False
    for key in _SCHEMA_LISTS:
        if not all(compilable(s) for s in schema.get(key, [])):
            return False
    for key in ("items", "additionalProperties", "not"):
        if key in schema and not compilable(schema[key]):
            return False
    return True


def compile_check(validator: Draft202012Validator) -> Check | None:
    schema = validator.schema
    if not compilable(schema):
        return None
    return fastjsonschema.compile({"$schema": "http://json-schema.org/draft-07/schema#",
                                   **schema})


def _check_for(validator: Draft202012Validator) -> Check | None:
    entry = _checks.get(id(validator))
    if entry is None or entry[0] is not validator:
        with _lock:
            entry = (validator, compile_check(validator))
            _checks[id(validator)] = entry
    return entry[1]


def first_error(validator: Draft202012Validator, document: Any) -> ValidationError | None:
    """jsonschema's first error for ``document``, or None when it is valid; a document the
    compiled check passes is valid without asking jsonschema."""
    if passes(validator, document):
        return None
    return next(iter(validator.iter_errors(document)), None)


def passes(validator: Draft202012Validator, document: Any) -> bool:
    """True only when the compiled check accepts ``document``; False means 'ask jsonschema'."""
    check = _check_for(validator)
    if check is None:
        return False
    try:
        check(document)
    except fastjsonschema.JsonSchemaException:
        return False
    return True
