"""Deployable request schemas (2.0): list filters and the two forms of a program request."""

from jsonschema import Draft202012Validator

from acceld.api.schemas import common

# Upstream's form: PATCH /deployables/{uuid}/program.
program_v2_0 = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "path": {"const": "/program"},
            "op": {"enum": ["replace", "add"]},
            "value": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"image_uuid": common.uuid},
                    "required": ["image_uuid"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["path", "op", "value"],
        "additionalProperties": False,
    },
}

# The seed's form: PATCH /deployables/{uuid}, one operation on /bitstream or /firmware.
seed_patch_v2_0 = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "path": {"enum": ["/bitstream", "/firmware"]},
            "op": {"enum": ["add", "replace"]},
            "value": common.uuid,
        },
        "required": ["path", "op", "value"],
        "additionalProperties": False,
    },
}

PROGRAM = Draft202012Validator(program_v2_0)
SEED_PATCH = Draft202012Validator(seed_patch_v2_0)

list_query_v2_0 = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 255},
        "device_id": {"type": "string", "pattern": r"^[0-9]{1,10}\Z"},
        "rp_uuid": common.uuid,
        "driver_name": {"type": "string", "maxLength": 100},
    },
}

LIST_QUERY = Draft202012Validator(list_query_v2_0)
