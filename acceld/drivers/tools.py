"""Running a vendor tool (fpgaconf, xbmgmt, ...) for a driver, with a timeout.

Every failure becomes a :class:`DriverError` whose message says what ran and
why it failed (the tool's stderr), since that message reaches the operator
through the API.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import Sequence

from acceld.drivers.base import DriverError

LOG = logging.getLogger(__name__)
_MAX_MESSAGE = 2000


def resolve_tool(path: str, what: str) -> str:
    """The tool's executable path, or a DriverError naming the option to fix."""
    found = path if os.sep in path else shutil.which(path)
    if not found or not os.path.isfile(found):
        raise DriverError(f"{what} not found at {path!r}: install it or set its path in the config")
    if not os.access(found, os.X_OK):
        raise DriverError(f"{what} at {found!r} is not executable")
    return found


def run_tool(argv: Sequence[str], timeout: float, what: str) -> str:
    """Run ``argv`` (argv[0] already resolved); return stdout or raise DriverError."""
    LOG.info("running %s", " ".join(argv))
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise DriverError(f"{what} did not finish within {timeout:g} s: {' '.join(argv)}") from exc
    except OSError as exc:
        raise DriverError(f"{what} could not be started: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip()[-_MAX_MESSAGE:]
        raise DriverError(f"{what} failed with exit status {done.returncode}: "
                          f"{detail or '(no output)'}")
    return done.stdout
