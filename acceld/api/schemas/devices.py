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

# 2.6: an operator returns a quarantined device to service (acceld.quarantine), with
# an optional reason kept in the device's events. Only "false": quarantine is the health
# rules' to set.
quarantine_op_v2_6 = {
    "type": "object",
    "properties": {
        "path": {"const": "/quarantined"},
        "op": {"const": "replace"},
        "value": {"const": False},
        "reason": {"type": ["string", "null"], "maxLength": 255},
    },
    "required": ["path", "op", "value"],
    "additionalProperties": False,
}
patch_v2_6 = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1,
    "items": {"oneOf": [status_patch_v2_0["items"], quarantine_op_v2_6]},
}

PATCH_V2_6 = Draft202012Validator(patch_v2_6)

HEALTH_STATES = ("healthy", "degraded", "unhealthy", "unknown")
list_query_v2_6 = {
    "type": "object",
    "properties": {
        **list_query_v2_0["properties"],
        "health": {"enum": list(HEALTH_STATES)},
        "quarantined": {"enum": ["true", "false"]},
    },
}

LIST_QUERY_V2_6 = Draft202012Validator(list_query_v2_6)
