"""[metrics] api_enabled under a WSGI server other than `acceld api`: the listener where it
can run (a uwsgi master that loads the app, with threads), else one WARNING at start saying
why it is off (acceld.metrics.wsgi_server). The listener itself under uwsgi:
tests/integration/test_uwsgi.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from acceld.metrics import wsgi_server
from tests.conftest import make_conf


def fake_uwsgi(worker: int = 0, **opt: object) -> SimpleNamespace:
    return SimpleNamespace(worker_id=lambda: worker, opt=opt)


@pytest.mark.parametrize("uwsgi, reason", [
    (None, "this WSGI server is not uwsgi"),
    (fake_uwsgi(1, master=True, **{"enable-threads": True}), "lazy-apps"),
    (fake_uwsgi(0, **{"enable-threads": True}), "without a master"),
    (fake_uwsgi(0, master=b"false", **{"enable-threads": b"true"}), "without a master"),
    (fake_uwsgi(0, master=b"true"), "no Python thread"),
    (fake_uwsgi(0, master=b"true", **{"enable-threads": b"false"}, threads=b"0"),
     "no Python thread"),
])
def test_why_the_listener_is_off(uwsgi, reason):
    assert reason in wsgi_server.why_off(uwsgi)


@pytest.mark.parametrize("opt", [
    {"master": True, "enable-threads": True},  # from the command line
    {"master": b"true", "enable-threads": b"true"},  # from an ini
    {"master": b"1", "threads": b"4"},
    {"master": [b"false", b"true"], "threads": [b"2"]},  # given twice: the last one
])
def test_a_uwsgi_master_with_threads_runs_it(opt):
    assert wsgi_server.why_off(fake_uwsgi(0, **opt)) is None


def test_off_says_so_once_at_start(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(wsgi_server, "_uwsgi", lambda: None)  # under mod_wsgi, gunicorn ...
    conf = make_conf(str(tmp_path), metrics__api_enabled=True, metrics__api_port=9466)
    with caplog.at_level(logging.WARNING, logger="acceld.metrics.wsgi_server"):
        assert wsgi_server.start(conf) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("[metrics] api_enabled = true, but the API's metrics listener "
                           "(127.0.0.1:9466) is off: this WSGI server is not uwsgi")


def test_metrics_off_is_silent(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(wsgi_server, "_uwsgi", lambda: None)
    with caplog.at_level(logging.DEBUG, logger="acceld.metrics.wsgi_server"):
        assert wsgi_server.start(make_conf(str(tmp_path))) is None
    assert caplog.records == []
