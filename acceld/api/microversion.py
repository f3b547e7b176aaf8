"""API microversions: the ordered list, header parsing and the response headers.

The changelog a human reads is ``rest_api_version_history.md`` beside this
module; each entry here has a one-line summary and the maximum is the last.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from acceld.api import errors

SERVICE_TYPE = "accelerator"
HEADER = "OpenStack-API-Version"
MIN_HEADER = "OpenStack-API-Minimum-Version"
MAX_HEADER = "OpenStack-API-Maximum-Version"

VERSIONS: list[tuple[str, str]] = [
    ("2.0", "Initial v2 API: device profiles, accelerator requests, devices, deployables."),
    ("2.1", "An admin may set /project_id in an ARQ bind patch."),
    ("2.2", "Device profiles can be shown by name: GET /device_profiles/{name}."),
    ("2.3", "Devices show their status: enabled or maintaining."),
    ("2.4", "acceld: ARQs show bind_failure_reason; devices show status_reason and acc_status; "
            "GET /hosts lists agents and their liveness."),
    ("2.5", "acceld: ARQ lists are paginated (limit, marker); a deployable program can be "
            "started asynchronously (202) and followed on the deployable; DELETE "
            "/hosts/{hostname} retires a host."),
    ("2.6", "acceld: device health (admin): devices show health, health_reason, "
            "health_since and quarantined, lists filter by ?health= and ?quarantined=, a "
            "device shows its bound instances; GET /devices/{uuid}/events; PATCH "
            "/devices/{uuid} returns a quarantined device to service."),
    ("2.7", "acceld: GET /device_profiles/{name_or_uuid}/explain (admin): why a profile can "
            "or cannot get an accelerator, Placement's view beside acceld's."),
    ("2.8", "acceld: standalone claims: POST /accelerator_requests with \"claim\" (and "
            "optionally \"consumer_uuid\"): acceld chooses the host and provider, allocates "
            "in Placement and binds, without Nova; ARQs show consumer_uuid."),
]


class Version(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text: str) -> "Version":
        major, minor = text.split(".")
        return cls(int(major), int(minor))


MIN_VERSION = Version.parse(VERSIONS[0][0])
MAX_VERSION = Version.parse(VERSIONS[-1][0])
DEFAULT_VERSION = MIN_VERSION

_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)\s*$")


def _not_acceptable(requested: str) -> errors.NotAcceptable:
    return errors.NotAcceptable(
        f"Version {requested} was requested but is not supported by this service. "
        f"The supported version range is: [{MIN_VERSION}, {MAX_VERSION}].")


def _find_value(header: str) -> str | None:
    """The accelerator entry of a header that may name several services."""
    bare = None
    for item in header.split(","):
        parts = item.strip().split(None, 1)
        if len(parts) == 2 and parts[0].lower() == SERVICE_TYPE:
            return parts[1].strip()
        if len(parts) == 1:
            bare = parts[0]
    return bare


def from_header(header: str | None) -> Version:
    """The version a request asks for; 406 if it cannot be served."""
    if header is None or not header.strip():
        return DEFAULT_VERSION
    value = _find_value(header)
    if value is None:
        # The header names other services only: accelerator gets the default.
        return DEFAULT_VERSION
    if value.lower() == "latest":
        return MAX_VERSION
    match = _VERSION_RE.match(value)
    if not match:
        raise errors.NotAcceptable(
            f"Invalid microversion {value!r}: expected 'accelerator X.Y' or 'latest'. "
            f"The supported version range is: [{MIN_VERSION}, {MAX_VERSION}].")
    version = Version(int(match.group(1)), int(match.group(2)))
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise _not_acceptable(str(version))
    return version


def response_headers(version: Version) -> dict[str, str]:
    return {
        MIN_HEADER: str(MIN_VERSION),
        MAX_HEADER: str(MAX_VERSION),
        HEADER: f"{SERVICE_TYPE} {version}",
        "Vary": HEADER,
    }


def require(version: Version, minimum: str) -> None:
    """406 unless ``version`` is at least ``minimum`` (upstream's wording)."""
    if version < Version.parse(minimum):
        raise errors.NotAcceptable(
            f"Request not acceptable. The minimal required API version should be {minimum}")
