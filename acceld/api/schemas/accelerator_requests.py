"""Accelerator request schemas, per microversion (2.0; 2.1 adds ``/project_id`` to binds)."""

from jsonschema import Draft202012Validator

from acceld.api.schemas import common

create_v2_0 = {
    "type": "object",
    "properties": {"device_profile_name": {"type": "string", "maxLength": 255}},
    "required": ["device_profile_name"],
    "additionalProperties": False,
}

# 2.8: a standalone claim (no Nova): acceld chooses the provider (on ``hostname`` when
# given), allocates in Placement under ``consumer_uuid`` (default: each ARQ's own) and binds.
create_v2_8 = {
    "type": "object",
    "properties": {
        "device_profile_name": {"type": "string", "maxLength": 255},
        "claim": {"type": "object",
                  "properties": {"hostname": {"type": "string", "minLength": 1,
                                              "maxLength": 255}},
                  "additionalProperties": False},
        "consumer_uuid": common.uuid,
    },
    "required": ["device_profile_name"],
    "additionalProperties": False,
}

BIND_PATHS = ("/hostname", "/device_rp_uuid", "/instance_uuid")

_add_value = {
    "/hostname": {"type": "string", "minLength": 1, "maxLength": 255},
    "/device_rp_uuid": common.uuid,
    "/instance_uuid": common.uuid,
    "/project_id": {"type": "string", "minLength": 1, "maxLength": 255},
}


def _operation(paths: tuple[str, ...]) -> dict:
    """One JSON-patch operation on one of ``paths``. RFC 6902 ignores members an operation
    does not define, so a ``value`` on remove is tolerated (never used); an ``add`` value is
    checked per path by :data:`ADD_VALUES` for a precise message."""
    return {"type": "object",
            "properties": {"op": {"enum": ["add", "remove"]}, "path": {"enum": list(paths)},
                           "value": {}},
            "required": ["op", "path"], "additionalProperties": False}


def _patch(paths: tuple[str, ...]) -> dict:
    return {
        "type": "object",
        "minProperties": 1,
        "propertyNames": {"pattern": common.UUID_PATTERN},
        "additionalProperties": {"type": "array", "minItems": 1, "maxItems": 4,
                                 "items": _operation(paths)},
    }


patch_v2_0 = _patch(BIND_PATHS)
patch_v2_1 = _patch(BIND_PATHS + ("/project_id",))

CREATE = Draft202012Validator(create_v2_0)
CREATE_V2_8 = Draft202012Validator(create_v2_8)
PATCH_V2_0 = Draft202012Validator(patch_v2_0)
PATCH_V2_1 = Draft202012Validator(patch_v2_1)
ADD_VALUES = {path: Draft202012Validator(schema) for path, schema in _add_value.items()}
