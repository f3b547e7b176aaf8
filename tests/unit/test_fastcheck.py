"""The compiled fast path never passes what jsonschema refuses (acceld.fastcheck).

Documents are generated from each schema itself (mostly well-formed, with wrong
types, extra keys, out-of-range numbers and strings mixed in), so that they
reach deep into the schema rather than failing at the top.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import acceld.api.schemas as schemas_pkg
from acceld import fastcheck
from acceld.conductor.fleet.agents import HELLO_SCHEMA

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**33) | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)


def all_validators() -> list[tuple[str, Draft202012Validator]]:
    found = []
    for info in pkgutil.iter_modules(schemas_pkg.__path__):
        module = importlib.import_module(f"{schemas_pkg.__name__}.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, Draft202012Validator):
                found.append((f"{info.name}.{name}", value))
    return found


def from_schema(schema, depth: int = 0):  # type: ignore[no-untyped-def]
    """Values shaped by ``schema``, often valid, often slightly wrong."""
    if not isinstance(schema, dict) or depth > 5:
        return ANY_JSON
    options = [ANY_JSON]
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
    if "const" in schema:
        options.append(st.just(schema["const"]))
    for key in ("oneOf", "anyOf", "allOf"):
        options += [from_schema(s, depth + 1) for s in schema.get(key, [])]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "string" in types:
        if "pattern" in schema:
            options.append(st.from_regex(schema["pattern"], fullmatch=True))
            options.append(st.from_regex(schema["pattern"]))
        options.append(st.text(min_size=0, max_size=300))
    if "integer" in types or "number" in types:
        options += [st.integers(-2, 2**32), st.sampled_from([0, 1, 1.0, 1.5, True, False,
                                                              2**31 - 1, 2**31])]
    if "null" in types:
        options.append(st.none())
    if "array" in types:
        item = from_schema(schema.get("items", {}), depth + 1)
        options.append(st.lists(item, min_size=0, max_size=3))
    if "object" in types or "properties" in schema:
        properties = schema.get("properties", {})
        keys = list(properties) + ["unexpected"]
        pattern_keys = [st.from_regex(p, fullmatch=True) for p in
                        schema.get("patternProperties", {})]
        key_strategy = st.sampled_from(keys) if not pattern_keys else st.one_of(
            st.sampled_from(keys), *pattern_keys)

        def build(pairs):  # type: ignore[no-untyped-def]
            return dict(pairs)

        def value_for(key):  # type: ignore[no-untyped-def]
            if key in properties:
                return from_schema(properties[key], depth + 1)
            for pattern, sub in schema.get("patternProperties", {}).items():
                import re

                if re.search(pattern, key):
                    return from_schema(sub, depth + 1)
            return ANY_JSON

        pair = key_strategy.flatmap(lambda k: st.tuples(st.just(k), value_for(k)))
        options.append(st.lists(pair, max_size=len(keys) + 2).map(build))
        # All properties present: the shape a real client sends.
        if properties:
            options.append(st.fixed_dictionaries(
                {k: from_schema(v, depth + 1) for k, v in properties.items()}))
    return st.one_of(*options)


VALIDATORS = [(name, v) for name, v in all_validators() + [("hello", HELLO_SCHEMA)]
              if fastcheck.compile_check(v)]


def test_the_request_schemas_have_a_fast_path() -> None:
    names = {name for name, _ in VALIDATORS}
    assert {"device_profiles.CREATE", "accelerator_requests.CREATE", "hello"} <= names


@pytest.mark.parametrize("name,validator", VALIDATORS, ids=[n for n, _ in VALIDATORS])
def test_fast_pass_implies_jsonschema_pass(name, validator) -> None:
    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(from_schema(validator.schema))
    def check(document) -> None:  # type: ignore[no-untyped-def]
        if fastcheck.passes(validator, document):
            errors = list(validator.iter_errors(document))
            assert not errors, f"{name}: fast path passed {document!r}: {errors[0].message}"

    check()


@pytest.mark.parametrize("document", [
    [{"name": "dp1", "groups": [{"resources:FPGA": "1", "trait:CUSTOM_X": "required"}]}],
    [{"name": "dp1", "groups": [{"accel:bitstream_id": "x"}], "description": None}],
])
def test_valid_profiles_take_the_fast_path(document) -> None:
    from acceld.api.schemas import device_profiles

    assert fastcheck.passes(device_profiles.CREATE, document)
    assert not list(device_profiles.CREATE.iter_errors(document))


@pytest.mark.parametrize("document", [
    [{"name": "dp1", "groups": [{"resources:FPGA": True}]}],
    [{"name": "dp1", "groups": [{"resources:FPGA": "1"}], "extra": 1}],
    [{"name": "dp 1", "groups": [{"resources:FPGA": "1"}]}],
    [{"name": "dp1", "groups": [{"resources:FPGA": "1"}]}] * 2,
])
def test_invalid_profiles_go_to_jsonschema(document) -> None:
    from acceld.api.schemas import device_profiles

    assert not fastcheck.passes(device_profiles.CREATE, document)
    assert list(device_profiles.CREATE.iter_errors(document))


def test_unsafe_keywords_get_no_fast_path() -> None:
    assert not fastcheck.compilable({"type": "array", "prefixItems": [{"type": "string"}]})
    assert not fastcheck.compilable({"enum": [1, True]})
    assert not fastcheck.compilable({"$ref": "#/$defs/x"})
    assert fastcheck.compilable({"type": "object", "properties": {"a": {"enum": ["x"]}}})
