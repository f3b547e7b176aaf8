"""How the long-running internal services (conductor, agent, driver process) live and stop."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Callable

LOG = logging.getLogger(__name__)


def run_until_signalled(stop_event: threading.Event, stop: Callable[[], None],
                        poll: float = 0.5) -> None:
    """Block until SIGTERM or SIGINT (or ``stop_event`` set by anyone), then ``stop()``."""
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())
    while not stop_event.wait(poll):
        pass
    stop()


def repeat_until_stopped(stop_event: threading.Event, interval: Callable[[], float],
                         action: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread that runs ``action`` every ``interval()`` seconds until stopped.

    An exception from ``action`` is logged and the loop goes on: one bad pass must not
    end the work for the rest of the process's life.
    """

    def loop() -> None:
        while not stop_event.wait(interval()):
            try:
                action()
            except Exception:  # noqa: BLE001 - keep the loop alive; the next pass retries
                LOG.exception("%s: pass failed; retried at the next interval", name)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
