"""A device's health as its driver sees it: the contract between drivers and the conductor.

Health is reported inside the hardware record (``"health": {...}``) so that it travels
with the inventory on the one path every driver already uses. It is optional: a driver
that says nothing (an external driver written before health existed) reports ``unknown``,
which never quarantines anything.

``counters`` carry the raw numbers a state was judged from (AER error counts, ECC
errors). They are shown to operators but are deliberately *not* part of what makes a
node's report "changed": a counter that only grows must not turn every heartbeat into an
inventory pull. Only the state (and its reason) does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"
UNKNOWN = "unknown"
HEALTH_STATES = (HEALTHY, DEGRADED, UNHEALTHY, UNKNOWN)
# Worse states win when a device has several sources (AER and NVML, say).
_SEVERITY = {UNKNOWN: 0, HEALTHY: 1, DEGRADED: 2, UNHEALTHY: 3}
MAX_REASON = 1000
MAX_COUNTERS = 64


@dataclass
class Health:
    """One device's health: a state, why (for anything but healthy/unknown), and counters."""

    state: str = UNKNOWN
    reason: str | None = None
    counters: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "counters": dict(self.counters)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Health":
        """From a record's ``health`` (already schema-checked); absent means unknown."""
        if not data:
            return cls()
        return cls(state=data.get("state", UNKNOWN), reason=data.get("reason"),
                   counters=dict(data.get("counters") or {}))


def worst(*healths: Health) -> Health:
    """Combine several sources' views of one device: the worst state wins; reasons of the
    sources at that state are joined; counters are merged (later sources win a name)."""
    if not healths:
        return Health()
    top = max(_SEVERITY[h.state] for h in healths)
    state = next(h.state for h in healths if _SEVERITY[h.state] == top)
    reasons = [h.reason for h in healths if _SEVERITY[h.state] == top and h.reason]
    counters: dict[str, int] = {}
    for h in healths:
        counters.update(h.counters)
    reason = "; ".join(reasons)[:MAX_REASON] if reasons else None
    return Health(state=state, reason=reason, counters=counters)


SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["state"],
    "description": ("The device's health as its driver sees it. Absent: unknown (never "
                    "quarantined). Counters are informational: they do not make a node's "
                    "report count as changed."),
    "properties": {
        "state": {"enum": list(HEALTH_STATES)},
        "reason": {"type": ["string", "null"], "maxLength": MAX_REASON},
        "counters": {
            "type": "object",
            "maxProperties": MAX_COUNTERS,
            "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "additionalProperties": {"type": "integer", "minimum": 0},
        },
    },
}
