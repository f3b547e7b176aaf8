"""No client can forge a log line (issue 25, item 4).

A ``%0A`` in a path, or a CR, LF, ESC or NUL in a header, a user name or a host's report,
used to reach a log as a line of its own (``... "DELETE /accelerator/v2/..." status:
204``, ``Agent of host node9 registered ...``). acceld's formatter (acceld.logs) escapes
control characters in every record it writes, whatever the call site, and keeps a
traceback's own lines. These tests send such values through the public API's pipeline
(access log included) and the conductor's internal server, and render every record the
processes log with the formatter logs.setup installs.
"""

from __future__ import annotations

import io
import logging
import sys
import urllib.parse
import wsgiref.util
from typing import Iterator

import pytest
import requests
from hypothesis import given, strategies as st

from acceld import logs
from acceld.api.app import wsgi_app
from acceld.clients.internal import InternalClient, InternalError
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.binding.handle_release import HOST_STEPS_PATH, HandleReleaseComponent
from acceld.conductor.service import Conductor
from acceld.internal import auth
from acceld.runtime.secrets import ensure_secret_file, internal_secret
from tests.conftest import make_conf

# What a forger sends: a line break, then a well-formed line of its own; a terminal escape
# (clear screen), a NUL, and a backslash that must not read as the start of an escape.
FORGED = ('\r\n2026-12-04 12:00:00.000 1 INFO acceld.api.access [-] 10.0.0.9 '
          '"DELETE /accelerator/v2/accelerator_requests/x" status: 204\x1b[2J\x00\\')
ESCAPED = ('\\r\\n2026-12-04 12:00:00.000 1 INFO acceld.api.access [-] 10.0.0.9 '
           '"DELETE /accelerator/v2/accelerator_requests/x" status: 204\\x1b[2J\\x00\\\\')
RAW = ("\r", "\n", "\x1b", "\x00")


class _Rendered(logging.Handler):
    """Every record, as the handlers logs.setup installed render it."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def rendered(tmp_path) -> Iterator[_Rendered]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    hook = sys.excepthook
    logs.setup(make_conf(str(tmp_path), log_file=str(tmp_path / "acceld.log"), debug=True),
               "test")
    (installed,) = root.handlers
    assert isinstance(installed.formatter, logs.RedactingFormatter)
    handler = _Rendered(installed.formatter)
    root.addHandler(handler)
    yield handler
    for extra in root.handlers:
        if extra not in saved[0]:
            extra.close()
    root.handlers[:], level = saved
    root.setLevel(level)
    sys.excepthook = hook


def _one_line_each(lines: list[str]) -> None:
    assert lines, "nothing was logged"
    for line in lines:
        for char in RAW:
            assert char not in line, repr(line)


def _with(lines: list[str], *needles: str) -> list[str]:
    found = [line for line in lines if all(n in line for n in needles)]
    assert found, (needles, lines)
    return found


# --- The escaping itself ------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "escaped"), [
    ("a\nb", "a\\nb"), ("a\rb", "a\\rb"), ("a\tb", "a\\tb"), ("a\x1b[31mb", "a\\x1b[31mb"),
    ("a\x00b", "a\\x00b"), ("a\x7fb", "a\\x7fb"), ("a\x85b", "a\\x85b"), ("a\x9bb", "a\\x9bb"),
    ("a\u2028b", "a\\u2028b"), ("a\\nb", "a\\\\nb"), ("plain", "plain"),
    ("h\u00e9t\u00e9 \u4e2d", "h\u00e9t\u00e9 \u4e2d"),
])
def test_escape_controls(raw, escaped) -> None:
    assert logs.escape_controls(raw) == escaped


@given(st.text())
def test_escaping_is_one_line_and_unambiguous(text) -> None:
    """No line break or control character is left, and the original can be read back
    (a backslash is escaped too, so ``\\n`` in a log is never an LF the client sent)."""
    escaped = logs.escape_controls(text)
    assert len(escaped.splitlines()) <= 1
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in escaped)
    readable = escaped.encode("ascii", "backslashreplace").decode("unicode_escape")
    assert readable == text


def test_a_traceback_keeps_its_lines_and_its_head_is_one_line(rendered) -> None:
    log = logging.getLogger("acceld.test.forging")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed for host %s", "node1" + FORGED)
    (line,) = rendered.lines
    head, _, traceback = line.partition("\n")
    assert f"failed for host node1{ESCAPED}" in head and not any(c in head for c in RAW)
    assert "Traceback (most recent call last):" in traceback
    assert any(t.endswith("RuntimeError: boom") for t in traceback.splitlines())
    log.info("stack for %s", FORGED, stack_info=True)
    head, _, stack = rendered.lines[-1].partition("\n")
    assert ESCAPED in head and stack.startswith("Stack (most recent call last):")


def test_the_log_file_has_one_line_per_record(rendered, tmp_path) -> None:
    logging.getLogger("acceld.test.forging").warning("agent %s said %r", FORGED, FORGED)
    for handler in logging.getLogger().handlers:
        handler.flush()
    written = (tmp_path / "acceld.log").read_text().splitlines()
    assert len(written) == 1 and ESCAPED in written[0]


# --- The public API: path, query string, headers, noauth identity ------------------------

def _call(app, path: str, query: str = "", **headers: str) -> int:  # type: ignore[no-untyped-def]
    environ: dict = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
                     "REMOTE_ADDR": "192.0.2.7", "wsgi.errors": io.StringIO()}
    environ.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    wsgiref.util.setup_testing_defaults(environ)
    status: list[str] = []
    body = app(environ, lambda s, h, exc_info=None: status.append(s))
    b"".join(body)
    body.close()
    return int(status[0].split()[0])


def test_api_values_are_escaped_in_every_line(rendered, tmp_path, sqlite_db) -> None:
    conf = make_conf(str(tmp_path))
    app = wsgi_app(conf, sqlite_db)
    # As a server hands them on: the path decoded (a %0A is an LF), the query string raw.
    status = _call(app, "/accelerator/v2/accelerator_requests/x" + FORGED,
                   "instance=" + FORGED, user_agent=FORGED, x_openstack_request_id=FORGED,
                   x_roles="member,reader")
    assert status == 400  # the NUL in the path
    # noauth's identity headers: the user and project name every line of the request.
    assert _call(app, "/accelerator/v2/device_profiles", x_user_id="alice" + FORGED,
                 x_project_id="demo" + FORGED, x_roles="member,reader") == 400
    assert _call(app, "/accelerator/v2/accelerator_requests",
                 "instance=" + urllib.parse.quote(FORGED)) == 400
    _one_line_each(rendered.lines)
    (access,) = _with(rendered.lines, '"GET /accelerator/v2/accelerator_requests/x')
    assert f"/x{ESCAPED}?instance={ESCAPED}" in access
    (identity,) = _with(rendered.lines, '"GET /accelerator/v2/device_profiles"')
    assert f"alice{ESCAPED}" in identity and f"demo{ESCAPED}" in identity


# --- The conductor: a hello's host name, a host-step report, a path -----------------------

@pytest.fixture
def conductor(tmp_path, sqlite_db) -> Iterator[tuple]:
    ensure_secret_file(str(tmp_path))
    conf = make_conf(str(tmp_path), conductor__port=0, conductor__agent_check_interval=3600,
                     conductor__bind_poll_interval=3600,
                     conductor__heartbeat_flush_interval=3600)
    conf.set_override("connection", str(sqlite_db.url), group="database")
    server = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db),
                                         HandleReleaseComponent(conf, sqlite_db)])
    server.start()
    yield conf, server.server.url
    server.stop()


def test_conductor_values_are_escaped_in_every_line(rendered, conductor) -> None:
    conf, url = conductor
    secret = internal_secret(conf)
    node = InternalClient(url, auth.Signer(auth.node_key(secret, "node1"), "node1"),
                          destination=auth.CONDUCTOR)
    cloud = InternalClient(url, auth.Signer(secret), destination=auth.CONDUCTOR)
    # A hello for a host named with a line of its own: refused by the schema (400) ...
    with pytest.raises(InternalError) as refused:
        node.call("POST", "/hello", {"status": "READY", "endpoint": "127.0.0.1:9",
                                     "hostname": "node1" + FORGED})
    assert refused.value.status == 400
    # ... and one signed with the cloud's secret, not the node's: refused and logged.
    with pytest.raises(InternalError) as refused:
        cloud.call("POST", "/hello", {"status": "READY", "endpoint": "127.0.0.1:9",
                                      "hostname": "node9"})
    assert refused.value.status == 401
    # A host-step report whose driver name (free text, logged) forges a line.
    report = {"host_steps": [{"driver_name": "fake" + FORGED, "attach_type": "MDEV",
                              "attach_info": {"uuid": FORGED}}]}
    node.call("POST", HOST_STEPS_PATH, report)
    # A path that, decoded, is a line of its own, with no credential: refused and logged.
    forged_path = "/hello" + urllib.parse.quote(
        "\r\nAgent of host node9 registered from 10.0.0.9:6667\x1b[2J\x00")
    assert requests.post(url + forged_path, json={}, timeout=10).status_code == 401
    _one_line_each(rendered.lines)
    _with(rendered.lines, "Internal call POST /hello answered 400")
    _with(rendered.lines, "Refused a hello for host node9 signed with the cloud's secret")
    _with(rendered.lines, "reported 1 prepared attach handle", f"fake{ESCAPED}")
    _with(rendered.lines, "Refused internal call POST /hello\\r\\nAgent of host node9 "
                          "registered from 10.0.0.9:6667\\x1b[2J\\x00")
