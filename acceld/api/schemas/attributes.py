"""Attribute request schemas (2.0)."""

from jsonschema import Draft202012Validator

from acceld.api.schemas import common

attribute = {
    "type": "object",
    "properties": {
        # The deployable's integer id, as upstream shows it in deployable_id. The openstack
        # CLI sends it as a string of digits (a positional argument); upstream accepts that.
        "deployable_id": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                                    {"type": "string", "pattern": r"^[1-9][0-9]{0,9}\Z"}]},
        "key": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^\S(.*\S)?\Z"},
        "value": {"type": "string", "maxLength": 255},
        "uuid": common.uuid,
    },
    "required": ["deployable_id", "key", "value"],
    "additionalProperties": False,
}

create_v2_0 = attribute

CREATE = Draft202012Validator(create_v2_0)

list_query_v2_0 = {
    "type": "object",
    "properties": {
        "deployable_id": {"type": "string", "pattern": r"^[0-9]{1,10}\Z"},
        "key": {"type": "string", "maxLength": 255},
    },
}

LIST_QUERY = Draft202012Validator(list_query_v2_0)
