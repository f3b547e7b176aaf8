"""Running a vendor tool (fpgaconf, xbmgmt, ...) for a driver, with a timeout.

Every failure becomes a :class:`DriverError` whose message says what ran and
why it failed (the tool's stderr), since that message reaches the operator
through the API.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Sequence

from acceld import privileged
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
    """Run ``argv`` (argv[0] already resolved) with root's privileges (acceld.privileged:
    the tools context of privsep); return stdout or raise DriverError."""
    LOG.info("running %s", " ".join(argv))
    try:
        status, stdout, stderr = privileged.run_tool(list(argv), timeout)
    except (OSError, privileged.NotAllowed) as exc:
        raise DriverError(f"{what} could not be started: {exc}") from exc
    if status is None:
        raise DriverError(f"{what} did not finish within {timeout:g} s: {' '.join(argv)}")
    if status != 0:
        detail = (stderr or stdout or "").strip()[-_MAX_MESSAGE:]
        raise DriverError(f"{what} failed with exit status {status}: "
                          f"{detail or '(no output)'}")
    return stdout
