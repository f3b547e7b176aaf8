"""Logs never carry tokens, passwords or internal credentials."""

from __future__ import annotations

import io
import logging

import pytest
from hypothesis import given, settings, strategies as st

from acceld import logs
from acceld.internal import auth

TOKEN = "gAAAAABmX2sEcretT0kenValue_abcdefghijklmnopqrstuvwxyz0123456789"
SECRET = "pa55-w0rd-XYZ"


@pytest.mark.parametrize("text", [
    f"X-Auth-Token: {TOKEN}",
    f"x-auth-token={TOKEN}",
    f"headers={{'X-Auth-Token': '{TOKEN}', 'Accept': 'application/json'}}",
    f'{{"X-Service-Token": "{TOKEN}"}}',
    f"X-Subject-Token: {TOKEN}",
    f"Authorization: {TOKEN}",
    f"token={TOKEN}",
    f'{{"token": "{TOKEN}"}}',
    f"password={SECRET}",
    f"{{'password': '{SECRET}', 'username': 'cyborg'}}",
    f"shared_secret = {SECRET}",
    f"connection mysql+pymysql://acceld:{SECRET}@db.example/acceld failed",
    f"postgresql+psycopg://acceld:{SECRET}@127.0.0.1:5432/acceld",
])
def test_redact_removes_the_secret(text: str) -> None:
    out = logs.redact(text)
    assert TOKEN not in out and SECRET not in out, out
    assert "***" in out


def test_internal_credentials_are_redacted() -> None:
    cred = auth.sign(b"k", "POST", "/binds/wake", b"{}")
    out = logs.redact(f"{auth.HEADER}: {cred}")
    assert cred not in out and cred.split(".")[2] not in out


def test_harmless_text_is_kept() -> None:
    text = "GET /v2/accelerator_requests?instance=abc 200 in 3 ms (project demo)"
    assert logs.redact(text) == text


def _logger(stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.RedactingFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s")))
    logger = logging.getLogger("acceld.test.redaction")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_formatter_redacts_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    log = _logger(stream)
    log.info("calling with %s", {"X-Auth-Token": TOKEN})
    try:
        raise RuntimeError(f"auth failed for password={SECRET}")
    except RuntimeError:
        log.exception("request failed, token=%s", TOKEN)
    written = stream.getvalue()
    assert "calling with" in written and "RuntimeError" in written
    assert TOKEN not in written and SECRET not in written


def test_setup_installs_the_redacting_formatter(tmp_path) -> None:
    from tests.conftest import make_conf

    conf = make_conf(str(tmp_path), log_file=str(tmp_path / "acceld.log"))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup(conf, "test")
        logging.getLogger("acceld.x").warning("token=%s", TOKEN)
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:  # the run's own handlers stay open
                handler.close()
        root.handlers[:], level = saved
        root.setLevel(level)
    written = (tmp_path / "acceld.log").read_text()
    assert "token=***" in written and TOKEN not in written


def _redact_every_pattern(text: str) -> str:
    """redact() without its quick check for a hint word: every pattern, every time."""
    for pattern in logs._SECRET_PATTERNS:
        replacement = r"\1***\3" if pattern.pattern.startswith("(?i)(://") else r"\1\2***"
        text = pattern.sub(replacement, text)
    return text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([
    "X-Auth-Token", "x-SERVICE-token", "Authorization", "x-acceld-credential", "PassWord",
    "secret", "TOKEN", "://", "user", ":", "=", " ", "'", '"', "@", "/", "abc", "p4ss", ",",
    "}", "{", "\n", "tok", "en", "pass", "word", "cred", "ential", ":/", "/"]), max_size=14)
       .map("".join))
def test_the_quick_check_never_skips_a_line_a_pattern_would_change(text):
    assert logs.redact(text) == _redact_every_pattern(text)
