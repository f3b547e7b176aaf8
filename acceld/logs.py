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


def setup(conf: cfg.ConfigOpts, service: str) -> None:
    handler: logging.Handler
    if conf.log_file:
        handler = logging.FileHandler(conf.log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(FORMAT.replace("%(name)s", f"{service} %(name)s")))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if conf.debug else logging.INFO)
    for noisy in ("urllib3", "keystoneauth", "stevedore", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
