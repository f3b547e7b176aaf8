"""The conductor's side of fencing: send a claim's token, read a refusal, and keep working
with agents from before fencing during a rolling upgrade.

A fenced call (409 whose message begins ``Fenced:``, acceld.agent.fences) did nothing on the
host: a newer claim acted on the handle or deployable after this conductor's claim lapsed.
The caller does nothing more for it and logs it once (no retry, no freeing, no recording),
unless the refusal shows the database behind the agent (:func:`caught_up`: a restored
backup), in which case the row's token is raised to the agent's floor and the call goes
again with a newer token.

Version skew. Conductors are upgraded before agents (README, "Upgrades"); an agent from
before fencing refuses the new fields with 400 ``Unknown keys: ...`` before it does
anything. The call is then sent once more without them (unfenced, as before this release),
one WARNING per host says so, and that host's calls go unfenced until the agent is seen to
have changed: the host's next hello that speaks internal API 1.1 or later (every agent since
1.1 fences) or another version than its last hello (an agent restarted into another release)
ends the spell at once (:meth:`SkewMemory.heard`, told by acceld.conductor.fleet.agents
through :func:`acceld.internal.versions.heard`, which fleet may import), and
:data:`SKEW_MEMORY` seconds bound it in any case. An agent that fences answers a token-less
call for a key it has fenced with a fenced 409 before doing anything (acceld.agent.fences):
the conductor then forgets the host and sends the call again with its tokens.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from sqlalchemy import Table

from acceld.agent.fences import FENCED, floor_in
from acceld.clients.agent import AgentCallError
from acceld.db import fences
from acceld.db.engine import Database
from acceld.internal import versions
from acceld.internal.versions import Version

LOG = logging.getLogger(__name__)

SKEW_MEMORY = 600.0  # seconds a host whose agent predates fencing is called without tokens
FENCING_SINCE: Version = (1, 1)  # every agent speaking this internal API version fences


def is_fenced(status: int, message: str) -> bool:
    """Whether an agent's answer is a fencing refusal (nothing was done)."""
    return status == 409 and message.startswith(FENCED)


def caught_up(db: Database, table: Table, row_id: int, message: str, what: str,
              hostname: str) -> bool:
    """After a fenced refusal: True when the row's token was below the floor the agent named
    (no newer claim exists: the database went back, e.g. restored from a backup) and is now
    raised to it, so that the caller's next claim is admitted; logged once per row."""
    floor = floor_in(message)
    if floor is None:
        return False
    with db.write() as conn:
        before = fences.catch_up(conn, table, row_id, floor)
    if before is None:
        return False
    LOG.warning("The fencing token of %s in the database (%d) is below the lowest the agent "
                "of host %s accepts (%d): the database was restored from a backup taken "
                "before that agent's last call (or lost the row's history); raised to %d, "
                "and the call goes again with a newer token", what, before, hostname, floor,
                floor)
    return True


class SkewMemory:
    """Hosts whose agents refused the fencing fields, until when; safe across threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self._versions: dict[str, Version] = {}  # host -> the version its last hello spoke

    def heard(self, hostname: str, version: Version) -> None:
        """A hello of ``hostname``'s agent speaking ``version``: an agent that fences (1.1 on),
        or one whose version changed (upgraded, restarted), is tried with tokens again."""
        with self._lock:
            before = self._versions.get(hostname)
            if before != version:
                self._versions[hostname] = version
            if hostname in self._until and (version >= FENCING_SINCE or before != version):
                del self._until[hostname]

    def forget(self, hostname: str) -> None:
        """The host's agent fences after all: its calls carry tokens from now on."""
        with self._lock:
            self._until.pop(hostname, None)

    def old(self, hostname: str) -> bool:
        with self._lock:
            until = self._until.get(hostname)
            if until is not None and until <= self._clock():
                del self._until[hostname]
                return False
            return until is not None

    def remember(self, hostname: str) -> bool:
        """True the first time (so the caller logs once per spell)."""
        with self._lock:
            first = hostname not in self._until
            self._until[hostname] = self._clock() + SKEW_MEMORY
            return first


SKEW = SkewMemory()
versions.on_hello(SKEW.heard)


def post_fenced(post: Callable[[dict[str, Any]], Any], hostname: str, body: dict[str, Any],
                fence: dict[str, Any], memory: SkewMemory | None = None) -> Any:
    """``post(body + fence)``; without ``fence`` for an agent from before fencing."""
    memory = memory if memory is not None else SKEW
    if not fence:
        return post(body)
    if memory.old(hostname):
        try:
            return post(body)
        except AgentCallError as exc:
            if not is_fenced(exc.status, exc.message):
                raise
            # It refused a token-less call for a key it fenced: it fences; nothing was done.
            memory.forget(hostname)
            LOG.info("The agent of host %s fences its calls (it refused a call without "
                     "fencing tokens): sending them with tokens again", hostname)
    try:
        return post({**body, **fence})
    except AgentCallError as exc:
        if not (exc.status == 400 and exc.message.startswith("Unknown keys:")
                and any(name in exc.message for name in fence)):
            raise
        if memory.remember(hostname):
            LOG.warning("The agent of host %s predates fencing (it refused %s); its calls are "
                        "sent without fencing tokens until it is upgraded, so a conductor "
                        "that stalls past its claim is not refused there", hostname,
                        ", ".join(sorted(fence)))
    return post(body)
