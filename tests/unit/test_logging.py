"""Logging through oslo.log: the context prefix, oslo.log's destinations and formats
(log_file, use_json, use_journal, log_config_append), rotation, and no secret in any line."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Iterator

import pytest

from acceld import logs, request_ids
from tests.conftest import make_conf

TOKEN = "gAAAAABmX2sEcretT0kenValue_abcdefghijklmnopqrstuvwxyz0123456789"
PASSWORD = "pa55-w0rd-XYZ"
GLOBAL_ID = "req-0b4d7e4e-8a2f-4c59-9a0b-2f8d9a6c1e11"


@pytest.fixture(autouse=True)
def restore_appended() -> Iterator[None]:
    """Each test sets logging up as a service does (the root logger comes back by the
    suite's own fixture, tests/conftest.py); a log_config_append file's logger too."""
    yield
    for name in ("acceld.test.appended",):
        logging.getLogger(name).handlers[:] = []


def _log_secrets() -> None:
    """A request's lines, with secrets in the message, its arguments and a traceback."""
    log = logging.getLogger("acceld.test.logging")
    with request_ids.bound(GLOBAL_ID, user_id="nova-user", project_id="tenant-1"):
        log.info("calling with %s", {"X-Auth-Token": TOKEN})
        log.warning('json body {"password": "%s"}', PASSWORD)
        try:
            raise RuntimeError(f"auth failed for password={PASSWORD}")
        except RuntimeError:
            log.exception("request failed, token=%s", TOKEN)
    log.info("outside any request")
    for handler in logging.getLogger().handlers:
        handler.flush()


def _no_secret(text: str) -> None:
    assert TOKEN not in text and PASSWORD not in text, text
    assert "***" in text


def test_lines_carry_both_request_ids_user_and_project(tmp_path):
    path = tmp_path / "acceld.log"
    logs.setup(make_conf(str(tmp_path), log_file=str(path)), "test")
    _log_secrets()
    lines = path.read_text().splitlines()
    (calling,) = [line for line in lines if "calling with" in line]
    ctx = request_ids.current()
    assert ctx is None  # the request's context ended with it
    assert f" INFO acceld.test.logging [{GLOBAL_ID} req-" in calling
    assert " nova-user tenant-1 " in calling
    (outside,) = [line for line in lines if "outside any request" in line]
    assert " INFO acceld.test.logging [-] outside" in outside
    _no_secret(path.read_text())


def test_use_json_lines_are_json_with_the_context_and_no_secret(tmp_path):
    path = tmp_path / "acceld.log"
    logs.setup(make_conf(str(tmp_path), log_file=str(path), use_json=True), "test")
    _log_secrets()
    records = [json.loads(line) for line in path.read_text().splitlines()]  # valid JSON
    calling = next(r for r in records if r["message"].startswith("calling with"))
    assert calling["context"]["global_request_id"] == GLOBAL_ID
    assert calling["context"]["user"] == "nova-user"
    assert calling["context"]["project"] == "tenant-1"
    failed = next(r for r in records if r["message"].startswith("request failed"))
    assert "RuntimeError" in failed["traceback"]
    _no_secret(path.read_text())


def test_use_journal_sends_redacted_lines_with_the_request_id(tmp_path, monkeypatch):
    """oslo.log's journal handler, its systemd binding replaced by a recorder (the
    python-systemd package is what a host running with use_journal installs)."""
    from oslo_log import handlers

    sent: list[tuple[str, dict]] = []

    class Journal:
        @staticmethod
        def send(message: str, **fields: object) -> None:
            sent.append((message, fields))

    monkeypatch.setattr(handlers, "journal", Journal)
    logs.setup(make_conf(str(tmp_path), use_journal=True), "test")
    _log_secrets()
    messages = [m for m, _ in sent if "acceld.test.logging" in m]
    assert len(messages) == 4
    # The program name each service's lines carry in the journal: acceld-<service>.
    assert {f["SYSLOG_IDENTIFIER"] for _, f in sent} == {"acceld-test"}
    assert any(GLOBAL_ID in m for m in messages)
    _no_secret("\n".join(messages) + "\n".join(
        str(f.get("EXCEPTION_TEXT", "")) for _, f in sent))


def test_use_syslog_names_the_service_as_the_program(tmp_path, monkeypatch):
    from oslo_log import handlers

    opened: list[str] = []
    monkeypatch.setattr(handlers.syslog, "openlog", lambda ident, *args: opened.append(ident))
    monkeypatch.setattr(handlers.syslog, "syslog", lambda *args: None)
    logs.setup(make_conf(str(tmp_path), use_syslog=True), "conductor")
    assert opened == ["acceld-conductor"]


def test_use_journal_without_the_systemd_bindings_is_one_line(tmp_path, monkeypatch):
    """Not oslo.log's RuntimeError traceback: what to install."""
    from oslo_log import handlers

    monkeypatch.setattr(handlers, "journal", None)
    with pytest.raises(SystemExit) as exited:
        logs.setup(make_conf(str(tmp_path), use_journal=True), "conductor")
    assert str(exited.value).startswith("acceld-conductor: use_journal = true needs the "
                                        "systemd Python bindings")
    assert "python3-systemd" in str(exited.value)



def test_a_log_dir_nothing_created_is_one_line_naming_the_option(tmp_path):
    """The recipe's `acceld db upgrade` ran before any unit's LogsDirectory= made
    /var/log/acceld: one line saying what to do, not the FileHandler traceback."""
    missing = tmp_path / "log" / "acceld"
    with pytest.raises(SystemExit) as exited:
        logs.setup(make_conf(str(tmp_path), log_dir=str(missing)), "db")
    assert str(exited.value) == (
        f"acceld-db: cannot open the log file {missing}/acceld-db.log ([DEFAULT] log_dir = "
        f"{missing}): No such file or directory; create the directory, writable by the user "
        "the service runs as")
    assert not missing.exists()


def test_a_log_file_in_a_missing_directory_names_log_file(tmp_path):
    path = tmp_path / "nowhere" / "api.log"
    with pytest.raises(SystemExit) as exited:
        logs.setup(make_conf(str(tmp_path), log_file=str(path)), "api")
    assert str(exited.value).startswith(
        f"acceld-api: cannot open the log file {path} ([DEFAULT] log_file = {path}): ")


@pytest.mark.parametrize("args", [["db", "upgrade"], ["agent"], ["conductor"],
                                  ["api"]])
def test_every_command_with_a_missing_log_dir_says_it_in_one_line(tmp_path, args):
    """The real command line, as an operator runs it: exit status 1, one line on stderr."""
    import subprocess

    from tests.support.net import free_port

    missing = tmp_path / "log"
    conf = tmp_path / "acceld.conf"
    conf.write_text(f"[DEFAULT]\nlog_dir = {missing}\n[internal]\nshared_secret = {'0' * 64}\n"
                    f"[api]\nport = {free_port()}\n[conductor]\nport = {free_port()}\n")
    program = "import sys; from acceld.cmd.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", program, *args, "--config-file", str(conf),
                           "--state-path", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    service = "db" if args[0] == "db" else args[0]
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"acceld-{service}: cannot open the log file {missing}/acceld-{service}.log "
        f"([DEFAULT] log_dir = {missing}): No such file or directory; create the directory, "
        "writable by the user the service runs as"], done.stderr
    assert not missing.exists()


# oslo.log's own defaults, as parsers of its lines (kolla's fluentd, OpenStack-Ansible's)
# expect them: acceld adds no field.
OSLO_CONTEXT_FORMAT = ("%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(name)s "
                       "[%(global_request_id)s %(request_id)s %(user_identity)s] "
                       "%(instance)s%(message)s")
OSLO_DEFAULT_FORMAT = ("%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(name)s [-] "
                       "%(instance)s%(message)s")
OSLO_EXCEPTION_PREFIX = "%(asctime)s.%(msecs)03d %(process)d ERROR %(name)s %(instance)s"


def test_the_formats_are_oslo_logs_defaults(tmp_path):
    conf = make_conf(str(tmp_path))
    assert conf.logging_context_format_string == OSLO_CONTEXT_FORMAT
    assert conf.logging_default_format_string == OSLO_DEFAULT_FORMAT
    assert conf.logging_exception_prefix == OSLO_EXCEPTION_PREFIX
    from acceld.cmd.samples import config_sample

    assert f"#logging_context_format_string = {OSLO_CONTEXT_FORMAT}\n" in config_sample()


@pytest.mark.parametrize("service", ["api", "conductor", "agent", "driver-fpga"])
def test_log_dir_gives_each_service_its_own_file(tmp_path, service):
    logs.setup(make_conf(str(tmp_path), log_dir=str(tmp_path)), service)
    logging.getLogger("acceld.test.logging").info("written by %s", service)
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert [p.name for p in tmp_path.glob("*.log")] == [f"acceld-{service}.log"]
    (line,) = (tmp_path / f"acceld-{service}.log").read_text().splitlines()
    assert line.endswith(f" INFO acceld.test.logging [-] written by {service}"), line


def test_log_file_under_log_dir_is_the_operators_choice(tmp_path):
    logs.setup(make_conf(str(tmp_path), log_dir=str(tmp_path), log_file="mine.log"), "api")
    logging.getLogger("acceld.test.logging").info("mine")
    assert "mine" in (tmp_path / "mine.log").read_text()
    assert not (tmp_path / "acceld-api.log").exists()


def test_use_json_under_log_dir(tmp_path):
    logs.setup(make_conf(str(tmp_path), log_dir=str(tmp_path), use_json=True), "agent")
    logging.getLogger("acceld.test.logging").info("as json")
    for handler in logging.getLogger().handlers:
        handler.flush()
    (record,) = [json.loads(line) for line in
                 (tmp_path / "acceld-agent.log").read_text().splitlines()]
    assert record["message"] == "as json" and record["name"] == "acceld.test.logging"


def test_log_config_append_handlers_are_redacted_too(tmp_path):
    """An operator's logging config: its handlers and formats are used as written (oslo.log
    ignores the other logging options), and acceld still redacts every line."""
    out = tmp_path / "appended.log"
    config = tmp_path / "logging.conf"
    config.write_text(f"""[loggers]
keys = root, appended

[handlers]
keys = file

[formatters]
keys = plain

[logger_root]
level = INFO
handlers = file

[logger_appended]
level = DEBUG
handlers = file
qualname = acceld.test.appended
propagate = 0

[handler_file]
class = FileHandler
args = ({str(out)!r},)
formatter = plain

[formatter_plain]
format = APPENDED %(levelname)s %(name)s %(message)s
""")
    logs.setup(make_conf(str(tmp_path), log_config_append=str(config),
                         log_file=str(tmp_path / "ignored.log")), "test")
    _log_secrets()
    logging.getLogger("acceld.test.appended").debug("token=%s", TOKEN)
    for handler in logging.getLogger("acceld.test.appended").handlers:
        handler.flush()
    text = out.read_text()
    assert "APPENDED INFO acceld.test.logging calling with" in text
    assert "APPENDED DEBUG acceld.test.appended token=***" in text
    assert not (tmp_path / "ignored.log").exists()
    _no_secret(text)


def test_a_renamed_log_file_is_left_behind_without_a_signal(tmp_path):
    """What ``watch_log_file`` did: the file handler notices logrotate's rename and opens
    a new file at the configured path (SIGHUP also sets logging up again)."""
    path = tmp_path / "acceld.log"
    logs.setup(make_conf(str(tmp_path), log_file=str(path)), "test")
    log = logging.getLogger("acceld.test.logging")
    log.info("before rotation")
    os.rename(path, tmp_path / "acceld.log.1")
    log.info("after rotation")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert "after rotation" in path.read_text()
    assert "after rotation" not in (tmp_path / "acceld.log.1").read_text()


def test_reopen_closes_the_file_it_replaces(tmp_path):
    path = tmp_path / "acceld.log"
    conf = make_conf(str(tmp_path), log_file=str(path))
    logs.setup(conf, "test")
    (first,) = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    logs.reopen(conf)
    assert first.stream is None or first.stream.closed
    logging.getLogger("acceld.test.logging").info("after reopen")
    assert "after reopen" in path.read_text()


def test_without_a_destination_lines_go_to_standard_error(tmp_path, capfd):
    """Standard output is for a service's announcements (the all-in-one reads them)."""
    logs.setup(make_conf(str(tmp_path)), "test")
    logging.getLogger("acceld.test.logging").warning("to stderr, token=%s", TOKEN)
    out, err = capfd.readouterr()
    assert "to stderr, token=***" in err and "to stderr" not in out


def test_keystoneauth_retry_warnings_are_debug_lines(tmp_path):
    """Outages are logged once each way by acceld; keystoneauth's per-retry WARNINGs are
    dropped, or kept as DEBUG lines with ``debug`` on."""
    path = tmp_path / "acceld.log"
    session_log = logging.getLogger("keystoneauth.session")
    for debug in (False, True):
        logs.setup(make_conf(str(tmp_path), log_file=str(path), debug=debug,
                             default_log_levels=["keystoneauth=DEBUG"]), "test")
        session_log.warning("Failure: %(e)s. Retrying in %(delay).1fs. %(retries)s retries "
                            "left", {"e": f"refused {debug}", "delay": 0.5, "retries": 2})
        session_log.warning("Something else %s", debug)
    text = path.read_text()
    assert "refused False" not in text
    assert " DEBUG keystoneauth.session [-] Failure: refused True" in text
    assert " WARNING keystoneauth.session [-] Something else False" in text


def test_oslo_log_options_are_registered_once(tmp_path):
    conf = make_conf(str(tmp_path))
    for name in ("debug", "log_file", "log_dir", "log_config_append", "use_journal",
                 "use_json", "use_syslog", "log_rotation_type", "default_log_levels",
                 "logging_context_format_string"):
        assert name in conf, name
    import acceld.conf
    from acceld.conf import opts

    acceld.conf.register_opts(conf)  # again, on a parsed configuration: nothing to do
    names = [opt.dest for _group, group_opts in opts.list_opts() if _group == "DEFAULT"
             for opt in group_opts]
    assert "log_config_append" in names and names.count("debug") == 1

