"""A device profile's request groups as Nova puts them to Placement.

Nova turns each group of a device profile into one granular request group of its
allocation-candidates query (``resources<S>``, ``required<S>`` with ``!`` for a forbidden
trait, ``member_of<S>``), and asks that one provider satisfy it. ``accel:*`` keys are for
acceld alone (a bitstream to program, ...): Placement never sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode


@dataclass(frozen=True)
class RequestGroup:
    index: int
    resources: dict[str, int]
    required: tuple[str, ...]
    forbidden: tuple[str, ...]
    member_of: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)  # accel:* keys, not Placement's

    @property
    def suffix(self) -> str:
        return f"_ACCEL{self.index}"

    @property
    def amount(self) -> int:
        """Accelerators of this group: one ARQ, so one attach handle, each."""
        return sum(self.resources.values())

    def placement_query(self, in_tree: str | None = None) -> str:
        """The group's allocation-candidates query string, Nova's way (one suffixed group)."""
        s = self.suffix
        params = [(f"resources{s}", ",".join(f"{rc}:{n}" for rc, n in
                                             sorted(self.resources.items())))]
        traits = [*self.required, *(f"!{t}" for t in self.forbidden)]
        if traits:
            params.append((f"required{s}", ",".join(traits)))
        if self.member_of:
            params.append((f"member_of{s}", "in:" + ",".join(self.member_of)))
        if in_tree:
            params.append((f"in_tree{s}", in_tree))
        return urlencode(params, safe=":,!")

    def describe(self) -> str:
        """``FPGA:1, requires CUSTOM_X, forbids CUSTOM_Y``: what the group asks, in a line."""
        parts = [", ".join(f"{rc}:{n}" for rc, n in sorted(self.resources.items()))
                 or "no resources"]
        if self.required:
            parts.append("requires " + " ".join(self.required))
        if self.forbidden:
            parts.append("forbids " + " ".join(self.forbidden))
        if self.member_of:
            parts.append("member of " + " or ".join(self.member_of))
        return ", ".join(parts)

    def to_wire(self) -> dict:
        return {"group_id": self.index, "resources": dict(sorted(self.resources.items())),
                "required_traits": list(self.required),
                "forbidden_traits": list(self.forbidden), "member_of": list(self.member_of),
                "accel": dict(sorted(self.extra.items()))}


def parse(groups: list[dict[str, str]], member_of: tuple[str, ...] = ()) -> list[RequestGroup]:
    """The stored groups of a profile (validated when it was created)."""
    out = []
    for index, group in enumerate(groups):
        resources: dict[str, int] = {}
        required: list[str] = []
        forbidden: list[str] = []
        extra: dict[str, str] = {}
        for key, value in group.items():
            prefix, _, name = key.partition(":")
            if prefix == "resources":
                resources[name] = int(value)
            elif prefix == "trait":
                (required if value == "required" else forbidden).append(name)
            else:
                extra[key] = value
        out.append(RequestGroup(index, resources, tuple(sorted(required)),
                                tuple(sorted(forbidden)), member_of, extra))
    return out
