"""Outage bookkeeping: one WARNING when a dependency goes away, one when it is back.

A dependency (Placement, a node's agent, the image service, the database)
that cannot be reached is an outage to wait out, not an error to report on
every retry: retry loops call :meth:`OutageLog.down` on each failure and
:meth:`OutageLog.up` on each success, and only the transitions are logged (no
traceback). The log also says how long each outage has lasted, which callers
use for their backoff. Safe to share between threads.

Remote services (Placement, the agents, the image service) are tracked in one log
per process, :func:`process_log`, which every component of the conductor uses:
an outage that binding and the Placement sync both meet is logged once each way,
by whichever notices first (under its own logger), not once per path.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

PLACEMENT = "Placement"  # the name of a Placement outage, whichever component meets it


# Seconds a 503 for an unreachable backend (the database) tells clients to wait: the
# public API's and the internal servers' alike.
RETRY_AFTER_SECONDS = 5

class OutageLog:
    """The outages in progress, by name (``"Placement"``, ``"the agent of host n1"``)."""

    def __init__(self, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._since: dict[str, float] = {}
        self._guard = threading.Lock()

    def down(self, what: str, detail: str, consequence: str = "",
             logger: logging.Logger | None = None) -> float:
        """Record a failed call; log a WARNING (to ``logger``, the log's own by default) if
        ``what`` was up. Seconds it has been down."""
        log = logger or self._log
        now = self._clock()
        with self._guard:
            first = what not in self._since
            started = self._since.setdefault(what, now)
        if first:
            log.warning("%s is unavailable: %s%s", what, detail,
                        f"; {consequence}" if consequence else "")
        else:
            log.debug("%s is still unavailable: %s", what, detail)
        return now - started

    def up(self, what: str, logger: logging.Logger | None = None) -> None:
        """Record a successful call; log a WARNING if ``what`` was down."""
        if what not in self._since:  # the common case, without the lock
            return
        with self._guard:
            started = self._since.pop(what, None)
        if started is not None:
            (logger or self._log).warning("%s is available again after %.1f s", what,
                                          self._clock() - started)

    def is_down(self, what: str) -> bool:
        return what in self._since


_PROCESS: OutageLog | None = None
_PROCESS_GUARD = threading.Lock()


def process_log() -> OutageLog:
    """This process's log of remote-service outages, shared by every component."""
    global _PROCESS
    with _PROCESS_GUARD:
        if _PROCESS is None:
            _PROCESS = OutageLog(logging.getLogger(__name__))
        return _PROCESS


def forget_process_log() -> None:
    """Start a fresh process log (tests: one test's outage must not carry into the next)."""
    global _PROCESS
    with _PROCESS_GUARD:
        _PROCESS = None
