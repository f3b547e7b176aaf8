"""Device profile request schemas, per microversion (one so far: 2.0)."""

import re

from jsonschema import Draft202012Validator

from acceld.api.schemas import common

NAME_PATTERN = r"^[a-zA-Z0-9-_]+\Z"
RESOURCE_CLASS_PATTERN = r"^[A-Z0-9_]+\Z"
TRAIT_PATTERN = r"^[A-Z0-9_]+\Z"

group = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {
        r"^resources:[A-Z0-9_]+\Z": {"type": "string", "pattern": r"^[1-9][0-9]{0,8}\Z"},
        r"^trait:[A-Z0-9_]+\Z": {"enum": ["required", "forbidden"]},
        r"^accel:.+\Z": {"type": "string", "maxLength": 255},
    },
    "additionalProperties": False,
}

profile = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NAME_PATTERN},
        "description": {"type": ["string", "null"], "maxLength": 255},
        "uuid": common.uuid,
        "groups": {"type": "array", "minItems": 1, "maxItems": 64, "items": group},
    },
    "required": ["name", "groups"],
    "additionalProperties": False,
}

create_v2_0 = {"type": "array", "minItems": 1, "maxItems": 1, "items": profile}

CREATE = Draft202012Validator(create_v2_0)

# Placement's standard resource classes (os-resource-classes); anything else must be CUSTOM_*.
STANDARD_RESOURCE_CLASSES = frozenset({
    "VCPU", "MEMORY_MB", "DISK_GB", "PCI_DEVICE", "SRIOV_NET_VF", "NUMA_SOCKET", "NUMA_CORE",
    "NUMA_THREAD", "NUMA_MEMORY_MB", "IPV4_ADDRESS", "VGPU", "VGPU_DISPLAY_HEAD",
    "NET_BW_EGR_KILOBIT_PER_SEC", "NET_BW_IGR_KILOBIT_PER_SEC", "PCPU", "MEM_ENCRYPTION_CONTEXT",
    "FPGA", "PGPU", "NET_PACKET_RATE_KILOPACKET_PER_SEC",
    "NET_PACKET_RATE_EGR_KILOPACKET_PER_SEC", "NET_PACKET_RATE_IGR_KILOPACKET_PER_SEC",
})
KEY_PREFIXES = ("resources:", "trait:", "accel:")


def group_key_problem(key: str) -> str | None:
    """Why a group key is not acceptable, in words; None when it is fine."""
    if not key.startswith(KEY_PREFIXES):
        return f"group key {key!r} must start with 'resources:', 'trait:' or 'accel:'"
    prefix, _, name = key.partition(":")
    if not name:
        return f"group key {key!r} has nothing after '{prefix}:'"
    if prefix in ("resources", "trait") and not re.fullmatch(r"[A-Z0-9_]+", name):
        return f"{prefix} name {name!r} must be upper case letters, digits and underscores"
    if prefix == "resources" and not (name in STANDARD_RESOURCE_CLASSES
                                      or name.startswith("CUSTOM_")):
        return (f"resource class {name!r} is neither a standard Placement class "
                "(FPGA, PGPU, VGPU, ...) nor a CUSTOM_ class")
    return None
