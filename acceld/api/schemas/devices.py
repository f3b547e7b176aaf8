"""Device request schemas (2.0; unchanged since)."""

from jsonschema import Draft202012Validator

# The seed's enable/disable: one JSON-patch operation on /status, with an optional reason.
status_patch_v2_0 = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "path": {"const": "/status"},
            "op": {"const": "replace"},
            "value": {"enum": ["enabled", "disabled"]},
            "reason": {"type": ["string", "null"], "maxLength": 255},
        },
        "required": ["path", "op", "value"],
        "additionalProperties": False,
    },
}

STATUS_PATCH = Draft202012Validator(status_patch_v2_0)

# Query strings: equality filters, each at most 255 characters like their columns.
list_query_v2_0 = {
    "type": "object",
    "properties": {name: {"type": "string", "maxLength": 255}
                   for name in ("type", "vendor", "hostname")},
}

LIST_QUERY = Draft202012Validator(list_query_v2_0)
