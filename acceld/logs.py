"""Logging for every acceld process: one format, optional file, secrets never written."""

from __future__ import annotations

import logging
import re
import sys

from oslo_config import cfg

FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"

# Values that must never reach a log: tokens, passwords, internal credentials.
_SECRET_PATTERNS = [
    re.compile(r"(?i)(x-auth-token|x-service-token|x-subject-token|authorization|"
               r"x-acceld-credential)(['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
    re.compile(r"(?i)(password|secret|token)(['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
    re.compile(r"(?i)(://[^:/@\s]+:)([^@/\s]+)(@)"),
]


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        if pattern.groups == 3 and pattern.pattern.startswith("(?i)(://"):
            text = pattern.sub(r"\1***\3", text)
        else:
            text = pattern.sub(r"\1\2***", text)
    return text


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


# The service name of this process's log lines, kept for reopen().
_service = "acceld"


def setup(conf: cfg.ConfigOpts, service: str) -> None:
    global _service
    _service = service
    handler: logging.Handler
    if conf.log_file:
        handler = logging.FileHandler(conf.log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(FORMAT.replace("%(name)s", f"{service} %(name)s")))
    handler._acceld = True  # type: ignore[attr-defined]  # ours: reopen() may close it
    root = logging.getLogger()
    replaced = root.handlers[:]
    root.handlers[:] = [handler]
    for old in replaced:
        if getattr(old, "_acceld", False) and isinstance(old, logging.FileHandler):
            old.close()
    root.setLevel(logging.DEBUG if conf.debug else logging.INFO)
    for noisy in ("urllib3", "keystoneauth", "stevedore", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def reopen(conf: cfg.ConfigOpts) -> None:
    """After SIGHUP: open the log file again at its (possibly changed) configured path, so
    that a file logrotate renamed is left behind and a new one is written, and take the
    level from ``debug`` again."""
    setup(conf, _service)
