"""How the long-running internal services (conductor, agent, driver process) live and stop."""

from __future__ import annotations

import signal
import threading
from typing import Callable


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
    """Start a daemon thread that runs ``action`` every ``interval()`` seconds until stopped."""

    def loop() -> None:
        while not stop_event.wait(interval()):
            action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
