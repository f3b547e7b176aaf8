"""How the long-running internal services (conductor, agent, driver process) live and stop.

SIGTERM and SIGINT stop a service gracefully. SIGHUP (what logrotate sends) never
does: it re-reads the config files, so options marked mutable (``debug``,
``log_file``) take their new values, and reopens the log file at its configured
path (:func:`reload`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import sys
import threading
import time
from typing import Callable

from oslo_config import cfg

from acceld import logs

LOG = logging.getLogger(__name__)

RELOADED = "SIGHUP: configuration re-read, log file reopened"


# Set by `acceld all` in its services' environment: the all-in-one's pid.
PARENT_ENV = "ACCELD_ALL_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A service the all-in-one started stops (SIGTERM) when the all-in-one dies, even by
    SIGKILL: each service runs in a session of its own, so nothing else would reach it and
    it would go on serving, holding its port, with nobody to stop it. Linux's parent-death
    signal; the check after it covers a parent that died before it was set."""
    parent = os.environ.pop(PARENT_ENV, None)  # for this process only, not its children
    if not parent or not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the all-in-one's own stop is all there is
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)


def announce(line: str) -> None:
    """Print a service's announcement (``acceld api: <url>``) as ONE write.

    ``print`` writes the text and the newline separately when output is unbuffered
    (PYTHONUNBUFFERED), and the services' log lines share the stream: a log line written
    in between corrupts the URL that launchers and tests read from it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def reload(conf: cfg.ConfigOpts) -> None:
    """Re-read ``conf``'s files (mutable options change; oslo.config logs each change and
    warns of ignored ones) and reopen the log. A config file that no longer parses is
    logged and the old values stay: a reload never ends the service."""
    changed: dict = {}
    try:
        changed = conf.mutate_config_files()
    except Exception as exc:  # noqa: BLE001 - keep running on the values in force
        LOG.error("SIGHUP: the configuration could not be re-read (%s); the old values "
                  "stay in force", exc)
    logs.reopen(conf)
    LOG.info("%s%s", RELOADED, "".join(
        f"; {group or 'DEFAULT'}.{name}: {old} -> {new}"
        for (group, name), (old, new) in sorted(changed.items(), key=lambda i: str(i[0]))))


def start_stamp() -> int:
    """Wait for the next whole second and return it: a server without a database refuses
    credentials stamped before it (``not_before``), so a restart is no chance to replay
    what the previous process accepted. Credentials are stamped in whole seconds; one
    stamped now could have been made before this process began, hence the wait (< 1 s)."""
    now = time.time()
    stamp = math.floor(now) + 1
    time.sleep(stamp - now)
    return stamp


# Set by SIGHUP; handled by run_until_signalled's loop (one flag per process).
_hup = threading.Event()


def catch_hup_early() -> None:
    """Called first by each service's run(): from here on SIGHUP no longer ends the
    process (its default action); one that arrives while the service starts is handled
    when run_until_signalled begins."""
    signal.signal(signal.SIGHUP, lambda *_: _hup.set())


def take_hup() -> bool:
    """Whether a SIGHUP arrived since the last call (for loops of their own: `acceld all`)."""
    if _hup.is_set():
        _hup.clear()
        return True
    return False


def run_until_signalled(stop_event: threading.Event, stop: Callable[[], None],
                        poll: float = 0.5, conf: cfg.ConfigOpts | None = None) -> None:
    """Block until SIGTERM or SIGINT (or ``stop_event`` set by anyone), then ``stop()``;
    on SIGHUP :func:`reload` ``conf`` (in this thread, not in the signal handler)."""
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())
    catch_hup_early()
    while True:
        if take_hup() and conf is not None:
            reload(conf)
        if stop_event.wait(poll):
            break
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
