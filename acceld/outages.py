"""Outage bookkeeping: one WARNING when a dependency goes away, one when it is back.

A dependency (Placement, a node's agent, the image service, the database)
that cannot be reached is an outage to wait out, not an error to report on
every retry: retry loops call :meth:`OutageLog.down` on each failure and
:meth:`OutageLog.up` on each success, and only the transitions are logged (no
traceback). The log also says how long each outage has lasted, which callers
use for their backoff. Safe to share between threads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable


class OutageLog:
    """The outages in progress, by name (``"Placement"``, ``"the agent of host n1"``)."""

    def __init__(self, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self._since: dict[str, float] = {}
        self._guard = threading.Lock()

    def down(self, what: str, detail: str, consequence: str = "") -> float:
        """Record a failed call; log a WARNING if ``what`` was up. Seconds it has been down."""
        now = self._clock()
        with self._guard:
            first = what not in self._since
            started = self._since.setdefault(what, now)
        if first:
            self._log.warning("%s is unavailable: %s%s", what, detail,
                              f"; {consequence}" if consequence else "")
        else:
            self._log.debug("%s is still unavailable: %s", what, detail)
        return now - started

    def up(self, what: str) -> None:
        """Record a successful call; log a WARNING if ``what`` was down."""
        if what not in self._since:  # the common case, without the lock
            return
        with self._guard:
            started = self._since.pop(what, None)
        if started is not None:
            self._log.warning("%s is available again after %.1f s", what,
                              self._clock() - started)

    def is_down(self, what: str) -> bool:
        return what in self._since

    def names(self) -> list[str]:
        with self._guard:
            return sorted(self._since)
