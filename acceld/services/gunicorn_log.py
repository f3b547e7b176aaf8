"""gunicorn's own lines (the master's start, its workers booting and exiting, a worker's
errors) through acceld's logging, rather than to standard error in gunicorn's format: one
file, one format (oslo.log's) and the same redaction for every line the API writes."""

from __future__ import annotations

from typing import Any

from gunicorn import glogging


class OsloLogger(glogging.Logger):
    """gunicorn's logger class with no handler of its own: ``gunicorn.error`` propagates to
    the root logger, which :func:`acceld.logs.setup` gave oslo.log's handlers (file,
    journal, syslog, JSON). No access log: acceld.api.access_log writes one line per
    request itself."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        # Only the handlers gunicorn made (a log_config_append file may give its own).
        for log in (self.error_log, self.access_log):
            for handler in list(log.handlers):
                if getattr(handler, "_gunicorn", False):
                    log.removeHandler(handler)
        self.error_log.propagate = True
