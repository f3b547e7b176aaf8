"""The internal API's version, negotiated in each hello.

A hello (agent -> conductor, driver process -> agent) says the version its sender speaks
in ``api_version``; the answer says the version both will use: the lower of the sender's
and the server's. A hello without the field is 1.0, the format of the release before
versions were negotiated (the seed's fields plus ``hostname``, ``heartbeat_interval``,
``hardware_digest``, ``discovery``, ``drivers``), and is answered exactly in 1.0's format,
without the field. A server serves every version from OLDEST to CURRENT: this release's and
the previous release's (docs/upgrades.md, "Allowed skew"); a hello speaking another major
version, or one older than OLDEST, is 400 naming what is served.

Versions:
  1.0  the hellos and answers before negotiation.
  1.1  ``api_version`` in hellos, their answers and an agent's ``GET /version``.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable

LOG = logging.getLogger(__name__)

Version = tuple[int, int]
CURRENT: Version = (1, 1)
OLDEST: Version = (1, 0)
UNVERSIONED: Version = (1, 0)  # what a hello without the field speaks
FIELD = "api_version"
SCHEMA = {"type": "string", "pattern": r"^[0-9]{1,3}\.[0-9]{1,3}$"}
_FORM = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
# How long a client keeps leaving the field out for a server that refused it (then it
# tries again: the server may have been upgraded meanwhile).
LEGACY_FOR = 600.0


# Who wants to know the version each host's hello speaks (the conductor's fencing, whose
# token-less spell for an old agent ends when it is upgraded): registered by them, so the
# hello's handler (acceld.conductor.fleet) need not import what listens.
_HELLO_LISTENERS: list[Callable[[str, "Version"], None]] = []


def on_hello(listener: Callable[[str, Version], None]) -> None:
    """Call ``listener(hostname, version)`` for each hello a conductor accepts."""
    _HELLO_LISTENERS.append(listener)


def heard(hostname: str, version: Version) -> None:
    """A hello of ``hostname`` speaking ``version`` was accepted: tell the listeners."""
    for listener in _HELLO_LISTENERS:
        listener(hostname, version)


class Unsupported(ValueError):
    """A hello speaking a version this server does not serve."""


def text(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def parse(value: str) -> Version:
    if not _FORM.fullmatch(value):
        raise Unsupported(f"Invalid {FIELD} {value!r}: expected MAJOR.MINOR.")
    major, minor = value.split(".")
    return int(major), int(minor)


def offered(hello: dict[str, Any]) -> Version:
    """The version ``hello`` speaks (Unsupported when malformed)."""
    return parse(hello[FIELD]) if FIELD in hello else UNVERSIONED


def agree(hello: dict[str, Any]) -> Version:
    """The version to answer ``hello`` in (Unsupported when none is shared)."""
    spoken = offered(hello)
    if spoken[0] != CURRENT[0] or spoken < OLDEST:
        raise Unsupported(
            f"Internal API {text(spoken)} is not served here: this release serves "
            f"{text(OLDEST)} to {text(CURRENT)} (upgrade through every release, "
            "controllers first).")
    return min(spoken, CURRENT)


def answer(hello: dict[str, Any], agreed: Version, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as the sender's version has them: 1.0 has no version field."""
    if FIELD in hello:
        return {**fields, FIELD: text(agreed)}
    return fields


def refused(status: int, message: str) -> bool:
    """Whether a hello's 400 refused the version field (a server from before it)."""
    return status == 400 and f"'{FIELD}'" in message


class Speaker:
    """A client's side: adds the field to its hellos, and leaves it out for LEGACY_FOR
    seconds after a server refused it (one INFO line), so that a server of the previous
    release keeps hearing it."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self._legacy_until = 0.0
        self.agreed: Version | None = None

    def body(self, hello: dict[str, Any]) -> dict[str, Any]:
        if time.monotonic() < self._legacy_until:
            return hello
        return {**hello, FIELD: text(CURRENT)}

    def refused(self, status: int, message: str, sent: dict[str, Any]) -> bool:
        """True when the hello must go again without the field."""
        if FIELD not in sent or not refused(status, message):
            return False
        LOG.info("%s does not negotiate the internal API version (a previous release): "
                 "speaking %s to it for %d s", self.peer, text(UNVERSIONED), LEGACY_FOR)
        self._legacy_until = time.monotonic() + LEGACY_FOR
        self.agreed = UNVERSIONED
        return True

    def answered(self, sent: dict[str, Any], answer: Any) -> None:
        if FIELD not in sent:
            self.agreed = UNVERSIONED
            return
        value = answer.get(FIELD) if isinstance(answer, dict) else None
        try:
            self.agreed = parse(value) if isinstance(value, str) else UNVERSIONED
        except Unsupported:
            self.agreed = UNVERSIONED
