"""The noauth guard's address rules and its start-up warning (issue 16, item 5)."""

from __future__ import annotations

import logging

import pytest
from oslo_config import cfg

from acceld import config
from acceld.services import noauth_guard


def _conf(tmp_path, text: str) -> cfg.ConfigOpts:
    path = tmp_path / "acceld.conf"
    path.write_text(text)
    return config.load(config_files=[str(path)], conf=cfg.ConfigOpts())


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost",
                                  "LOCALHOST", "::ffff:127.0.0.1"])
def test_loopback_addresses(host):
    assert noauth_guard.is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.0.2.1", "fe80::1",
                                  "api.example.com", "localhost.example.com", "128.0.0.1"])
def test_other_addresses(host):
    assert not noauth_guard.is_loopback(host)


def test_refused_beyond_loopback_without_the_insecure_option(tmp_path):
    conf = _conf(tmp_path, "[api]\nhost_ip = 0.0.0.0\n")
    with pytest.raises(noauth_guard.InsecureNoauth, match="allow_insecure_noauth = true"):
        noauth_guard.check(conf)


def test_the_insecure_option_allows_it_and_still_warns(tmp_path, caplog):
    conf = _conf(tmp_path, "[api]\nhost_ip = 0.0.0.0\nport = 7001\nallow_insecure_noauth = true\n")
    with caplog.at_level(logging.WARNING, logger="acceld.services.noauth_guard"):
        noauth_guard.check(conf)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "anyone who can reach 0.0.0.0:7001 is an admin" in record.getMessage()
    assert "allow_insecure_noauth" in record.getMessage()


def test_keystone_is_neither_refused_nor_warned_about(tmp_path, caplog):
    conf = _conf(tmp_path, "[DEFAULT]\nauth_strategy = keystone\n[api]\nhost_ip = 0.0.0.0\n")
    with caplog.at_level(logging.WARNING):
        noauth_guard.check(conf)
    assert not caplog.records


def test_wsgi_refuses_noauth_even_on_loopback_without_the_insecure_option(tmp_path):
    """A WSGI server's listen address is not the application's to see (issue 25, item 3)."""
    conf = _conf(tmp_path, "[api]\nhost_ip = 127.0.0.1\n")
    with pytest.raises(noauth_guard.InsecureNoauth, match=r"set \[api\] allow_insecure_noauth"):
        noauth_guard.check_wsgi(conf)


def test_wsgi_noauth_with_the_insecure_option_warns(tmp_path, caplog):
    conf = _conf(tmp_path, "[api]\nallow_insecure_noauth = true\n")
    with caplog.at_level(logging.WARNING, logger="acceld.services.noauth_guard"):
        noauth_guard.check_wsgi(conf)
    [record] = caplog.records
    assert "anyone who can reach the server is an admin" in record.getMessage()


def test_wsgi_keystone_is_neither_refused_nor_warned_about(tmp_path, caplog):
    conf = _conf(tmp_path, "[DEFAULT]\nauth_strategy = keystone\n")
    with caplog.at_level(logging.WARNING):
        noauth_guard.check_wsgi(conf)
    assert not caplog.records
