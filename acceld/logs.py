"""Logging for every acceld process, through oslo.log: the options, formats and handlers
operators know from other OpenStack services, with secrets never written.

oslo.log gives the options (``debug``, ``log_file``, ``log_dir``, ``log_config_append``,
``use_journal``, ``use_json``, ``use_syslog``, ``log_rotation_type``, the format
strings ...; registered with [DEFAULT]'s, acceld.conf.default, with acceld's default log
levels) and formats every line with the thread's request context
(``[global_request_id request_id user project ...]``, acceld.request_ids). acceld adds:

- redaction: whatever handler a line goes to (file, stream, journal, syslog, JSON, a
  ``log_config_append`` handler), its message and traceback are redacted first;
- one record, one line: control characters in a line (a client's path, header, user or
  host name, anywhere in the message or the context prefix) are escaped (``\\n``,
  ``\\x1b``, ...; a backslash as ``\\\\``), so no client can forge a line; a traceback
  keeps its own lines (:func:`escape_controls`);
- standard error, not standard output, when no destination is configured: a service's
  standard output carries its announcements (``acceld api: <url>``, a driver's URL),
  which the all-in-one and driver launchers read;
- each service its own program name, ``acceld-<service>`` (``acceld-api``,
  ``acceld-conductor``, ``acceld-agent``, ``acceld-driver-NAME``), as other OpenStack
  services name theirs: the file under ``log_dir`` (``acceld-api.log``), the journal's
  ``SYSLOG_IDENTIFIER`` and syslog's ident. oslo.log's default formats are kept as they
  are, so that parsers written for them (kolla's fluentd, OpenStack-Ansible's) read
  every line;
- the web server's own lines (gunicorn's ``gunicorn.error``: start, workers, errors)
  go to these handlers too (acceld.services.gunicorn_log);
- keystoneauth's per-retry WARNINGs become DEBUG lines: an outage is logged once when it
  starts and once when it ends (acceld.outages);
- SIGHUP (what logrotate sends) sets logging up again (:func:`reopen`). The file
  handler is a ``WatchedFileHandler`` either way, which reopens a file renamed under
  it by itself: what ``watch_log_file`` used to switch on in older oslo.log releases.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

from oslo_config import cfg
from oslo_log import formatters
from oslo_log import handlers as oslo_handlers
from oslo_log import log as oslo_log

PRODUCT = "acceld"
# The service this process runs (`conductor`, `api`, ...): its program name, for reopen().
_service = PRODUCT

# Values that must never reach a log: tokens, passwords, internal credentials.
_SECRET_PATTERNS = [
    re.compile(r"(?i)(x-auth-token|x-service-token|x-subject-token|authorization|"
               r"x-acceld-credential)(['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
    re.compile(r"(?i)(password|secret|token)(['\"]?\s*[:=]\s*['\"]?)([^'\"\s,}]+)"),
    re.compile(r"(?i)(://[^:/@\s]+:)([^@/\s]+)(@)"),
]

# Every secret pattern above needs one of these words: most lines have none and skip them.
# (Substring tests on the lowered text: a case-insensitive regex alternation cost ~5 us.)
_SECRET_HINTS = ("token", "authorization", "credential", "password", "secret", "://")


# What a client could use to forge a line or drive a terminal: every C0 control (CR, LF,
# NUL, ESC, ...), DEL, every C1 control, and the Unicode line and paragraph separators;
# the backslash too, so that an escape in a line always means an escaped character.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\]")
# In a traceback, whose lines are its own: the same, but its newlines and backslashes kept.
_UNSAFE_IN_TRACEBACK = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    escape = _ESCAPES.get(char)
    if escape is not None:
        return escape
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` on one line: control characters and backslashes escaped, Python-style.

    One regex search decides (most lines have nothing to escape)."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


def _one_line(line: str, record: logging.LogRecord,
              inner: logging.Formatter) -> str:
    """The formatted ``line`` with its head (prefix and message) escaped onto one line and
    the traceback or stack that logging appended to it kept as lines of their own."""
    if _UNSAFE.search(line) is None:
        return line
    tail = record.exc_text or (inner.formatStack(record.stack_info)
                               if record.stack_info else "")
    cut = line.rfind(tail) if tail else -1
    if cut < 0:  # no traceback, or one this formatter did not append: all of it, one line
        return escape_controls(line)
    head, tail = line[:cut], line[cut:]
    separator = "\n" if head.endswith("\n") else ""
    head = escape_controls(head[:-1] if separator else head)
    return head + separator + _UNSAFE_IN_TRACEBACK.sub(_escaped, tail)


def _may_hold_secret(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def redact(text: str) -> str:
    if not _may_hold_secret(text):
        return text
    for pattern in _SECRET_PATTERNS:
        if pattern.groups == 3 and pattern.pattern.startswith("(?i)(://"):
            text = pattern.sub(r"\1***\3", text)
        else:
            text = pattern.sub(r"\1\2***", text)
    return text


def _redact_values(value: Any) -> Any:
    """``value`` (decoded JSON) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redact_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_values(item) for item in value]
    return value


class RedactingFormatter(logging.Formatter):
    """Redacts what another formatter (oslo.log's context or JSON formatter, or one from
    ``log_config_append``) writes: the message is formatted and redacted before the inner
    formatter sees it (so JSON escaping cannot hide a secret from the patterns), the
    traceback is redacted as it is formatted, and the whole line once more; and keeps a
    record on one line (control characters escaped, the traceback's lines kept)."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter(
            "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
        original = self.inner.formatException

        def redacted_exception(*args, **kwargs):  # type: ignore[no-untyped-def]
            formatted = original(*args, **kwargs)
            return redact(formatted) if isinstance(formatted, str) else formatted

        self.inner.formatException = redacted_exception  # type: ignore[method-assign]
        # A structured (JSON) line is not redacted as a whole: the patterns would break its
        # syntax (``"auth_token": null``); each of its strings is, after decoding.
        self._whole_line = not isinstance(self.inner, (formatters.JSONFormatter,
                                                       formatters.FluentFormatter))

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info or record.exc_text or _may_hold_secret(message):
            clean = logging.makeLogRecord(record.__dict__)
            clean.msg = redact(message)
            clean.args = None
            clean.exc_text = None
        else:  # nothing to redact in the message (most lines): no copy of the record
            clean = record
        line = self.inner.format(clean)
        if self._whole_line:
            return redact(_one_line(line, clean, self.inner))
        # Structured: every string in it (error_summary, extras, ...), keeping its syntax;
        # JSON's own escaping keeps control characters from breaking its line.
        if isinstance(line, str):
            return json.dumps(_redact_values(json.loads(line)))
        return _redact_values(line)

    def formatException(self, ei) -> str:  # type: ignore[no-untyped-def, override]
        """Handlers that format a traceback themselves (the journal's EXCEPTION_TEXT)."""
        formatted = self.inner.formatException(ei)
        return formatted if isinstance(formatted, str) else "\n".join(formatted)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self.inner.formatTime(record, datefmt)


class _RetryLines(logging.Filter):
    """keystoneauth logs each retry of a call as a WARNING ("Failure: ... Retrying in
    0.5s", "Retriable status code 503. Retrying ..."). acceld logs an outage once when it
    starts and once when it ends (acceld.outages), so these become DEBUG lines: kept
    when ``debug`` is on, dropped otherwise."""

    _PREFIXES = ("Failure: ", "Retriable status code ")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not isinstance(record.msg, str) \
                or not record.msg.startswith(self._PREFIXES):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


_RETRY_FILTER = _RetryLines()


def quiet_retries() -> None:
    """Install the keystoneauth retry filter (idempotent; done on import)."""
    session_log = logging.getLogger("keystoneauth.session")
    if _RETRY_FILTER not in session_log.filters:
        session_log.addFilter(_RETRY_FILTER)


quiet_retries()


def program_name(service: str) -> str:
    """The program a service's lines come from: ``acceld-api``, ``acceld-driver-fpga``."""
    return f"{PRODUCT}-{service}"


def setup(conf: cfg.ConfigOpts, service: str, *, starting: bool = True) -> None:
    """Set up this process's logging from ``conf`` (again after a SIGHUP, ``starting``
    False). At start it names, in one WARNING, the options the files set that acceld does
    not use (acceld.upstream_conf: an upstream cyborg.conf's transport_url, ...)."""
    global _service
    _service = service
    root = logging.getLogger()
    previous = root.handlers[:]
    if conf.use_journal and not conf.log_config_append and oslo_handlers.journal is None:
        # One line, not oslo.log's RuntimeError traceback.
        raise SystemExit(f"{program_name(service)}: use_journal = true needs the systemd "
                         "Python bindings (Debian/Ubuntu: apt-get install python3-systemd; "
                         "in a virtualenv: pip install systemd-python)")
    # oslo.log names the file under log_dir, the journal's SYSLOG_IDENTIFIER and syslog's
    # ident after the running script (`acceld` for every service); each service is a
    # program of its own, as nova-api and nova-conductor are.
    name_binary = oslo_handlers._get_binary_name
    oslo_handlers._get_binary_name = lambda: program_name(service)
    try:
        oslo_log.setup(conf, PRODUCT)
    except OSError as exc:
        if not starting or not (conf.log_file or conf.log_dir):
            raise
        # A log_dir nothing has created yet (`acceld db upgrade` before a unit's
        # LogsDirectory= made it) or one the service's user cannot write: one line
        # naming the option, not the FileHandler traceback.
        options = ", ".join(f"{name} = {value}" for name, value in
                            (("log_dir", conf.log_dir), ("log_file", conf.log_file)) if value)
        raise SystemExit(f"{program_name(service)}: cannot open the log file "
                         f"{exc.filename or conf.log_file} ([DEFAULT] {options}): "
                         f"{exc.strerror or exc}; create the directory, writable by the "
                         "user the service runs as") from None
    finally:
        oslo_handlers._get_binary_name = name_binary
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)
    _redact_every_handler()
    for old in previous:
        if old not in root.handlers and isinstance(old, logging.FileHandler):
            old.close()  # a file oslo.log replaced (SIGHUP): do not leak its descriptor
    if starting:
        from acceld import upstream_conf

        upstream_conf.warn_unused(conf)


def log_files() -> list[str]:
    """The files this process's logging writes to (none: it logs to stderr or journald)."""
    return [handler.baseFilename for handler in logging.getLogger().handlers
            if isinstance(handler, logging.FileHandler)]


def _redact_every_handler() -> None:
    """Wrap every handler's formatter (the root's and any a log_config_append file put on
    another logger) in :class:`RedactingFormatter`, once."""
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if not isinstance(handler.formatter, RedactingFormatter):
                handler.setFormatter(RedactingFormatter(handler.formatter))


def reopen(conf: cfg.ConfigOpts) -> None:
    """After SIGHUP (and the configuration re-read): set logging up again, so that a
    file logrotate renamed is left behind and a new one is written at the configured
    path, and the level follows ``debug``."""
    setup(conf, _service, starting=False)
