"""Internal credentials: expiry, replay, tampering, wrong secret; and TLS on internal servers."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import pytest
import requests

from acceld.clients.internal import InternalClient, InternalError, tls_verify
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app, json_body, respond
from tests.conftest import make_conf
from tests.support.tls import self_signed

SECRET = b"s3cret-internal"
NOW = 1_800_000_000.0


def _verifier(ttl: int = 60) -> auth.Verifier:
    return auth.Verifier(SECRET, ttl)


def test_a_fresh_credential_is_accepted_once() -> None:
    verifier = _verifier()
    cred = auth.sign(SECRET, "POST", "/binds/wake", b"{}", now=NOW)
    verifier.verify("POST", "/binds/wake", b"{}", cred, now=NOW + 1)
    with pytest.raises(auth.CredentialError, match="replayed"):
        verifier.verify("POST", "/binds/wake", b"{}", cred, now=NOW + 2)


def test_credentials_expire() -> None:
    cred = auth.sign(SECRET, "GET", "/x", now=NOW)
    _verifier(ttl=30).verify("GET", "/x", b"", cred, now=NOW + 30)  # at the limit: fine
    for late in (NOW + 31, NOW + 3600):
        with pytest.raises(auth.CredentialError, match="expired"):
            _verifier(ttl=30).verify("GET", "/x", b"", cred, now=late)


def test_credentials_from_the_future_are_refused() -> None:
    cred = auth.sign(SECRET, "GET", "/x", now=NOW + 600)
    with pytest.raises(auth.CredentialError, match="expired"):
        _verifier().verify("GET", "/x", b"", cred, now=NOW)


def test_an_expired_credential_cannot_be_replayed_after_its_nonce_is_forgotten() -> None:
    """The nonce memory is pruned, but only of nonces whose credentials have expired."""
    verifier = _verifier(ttl=5)
    cred = auth.sign(SECRET, "GET", "/x", now=NOW)
    verifier.verify("GET", "/x", b"", cred, now=NOW)
    for i in range(5000):  # force pruning
        verifier.verify("GET", "/x", b"", auth.sign(SECRET, "GET", "/x", now=NOW + 10),
                        now=NOW + 10)
    with pytest.raises(auth.CredentialError, match="expired"):
        verifier.verify("GET", "/x", b"", cred, now=NOW + 10)


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/binds/wake", b'{"evil": 1}'),      # tampered body
    ("POST", "/binds/other", b"{}"),              # tampered path
    ("POST", "/binds/wake?x=1", b"{}"),           # added query string
    ("PUT", "/binds/wake", b"{}"),                # tampered method
])
def test_tampering_is_detected(method: str, path: str, body: bytes) -> None:
    cred = auth.sign(SECRET, "POST", "/binds/wake", b"{}", now=NOW)
    with pytest.raises(auth.CredentialError, match="wrong"):
        _verifier().verify(method, path, body, cred, now=NOW)


def test_wrong_secret_is_refused() -> None:
    cred = auth.sign(b"another-secret", "GET", "/x", now=NOW)
    with pytest.raises(auth.CredentialError, match="wrong"):
        _verifier().verify("GET", "/x", b"", cred, now=NOW)


@pytest.mark.parametrize("cred", [None, "", "abc", "1.2", "x.y.z", "1.2.3.4"])
def test_missing_or_malformed_credentials_are_refused(cred) -> None:
    with pytest.raises(auth.CredentialError):
        _verifier().verify("GET", "/x", b"", cred, now=NOW)


def _echo(req, resp) -> None:  # type: ignore[no-untyped-def]
    respond(resp, {"got": json_body(req)})


@pytest.fixture
def server(request) -> Iterator[InternalServer]:
    cert, key = getattr(request, "param", (None, None))
    app = build_app(SECRET, 60, {"/echo": {"POST": _echo}})
    srv = InternalServer(app, "127.0.0.1", 0, cert_file=cert, key_file=key).start()
    yield srv
    srv.stop()


def test_signed_calls_pass_and_a_captured_call_cannot_be_replayed(server) -> None:
    client = InternalClient(server.url, SECRET)
    assert client.call("POST", "/echo", {"a": 1}) == {"got": {"a": 1}}
    body = b'{"a": 1}'
    headers = {**auth.headers(SECRET, "POST", "/echo", body),
               "Content-Type": "application/json"}
    first = requests.post(server.url + "/echo", data=body, headers=headers, timeout=5)
    assert first.status_code == 200
    replay = requests.post(server.url + "/echo", data=body, headers=headers, timeout=5)
    assert replay.status_code == 401
    tampered = requests.post(server.url + "/echo", data=b'{"a": 2}', timeout=5,
                             headers={**headers, **auth.headers(SECRET, "POST", "/echo", body)})
    assert tampered.status_code == 401
    with pytest.raises(InternalError) as exc:
        InternalClient(server.url, b"wrong-secret").call("POST", "/echo", {})
    assert exc.value.status == 401


def test_oversized_body_refused_before_it_is_read() -> None:
    small = build_app(SECRET, 60, {"/echo": {"POST": _echo}}, max_body=1024)
    srv = InternalServer(small, "127.0.0.1", 0).start()
    try:
        body = b"x" * 4096
        signed = auth.headers(SECRET, "POST", "/echo", body)
        resp = requests.post(srv.url + "/echo", data=body, headers=signed, timeout=5)
        assert resp.status_code == 413
        assert "1024 bytes" in resp.text
        # A stranger's large body is refused for its credential, before its size.
        resp = requests.post(srv.url + "/echo", data=body, timeout=5)
        assert resp.status_code == 401
        ok = InternalClient(srv.url, SECRET).call("POST", "/echo", {"a": 1})
        assert ok == {"got": {"a": 1}}
    finally:
        srv.stop()


def test_expired_credential_over_http(server) -> None:
    stale = auth.sign(SECRET, "POST", "/echo", b"{}", now=time.time() - 3600)
    resp = requests.post(server.url + "/echo", data=b"{}", headers={auth.HEADER: stale},
                         timeout=5)
    assert resp.status_code == 401
    assert "secret" not in resp.text.lower()


def test_tls_internal_server_verified_with_the_configured_ca(tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    app = build_app(SECRET, 60, {"/echo": {"POST": _echo}})
    srv = InternalServer(app, "127.0.0.1", 0, cert_file=str(cert), key_file=str(key)).start()
    try:
        assert srv.url.startswith("https://")
        conf = make_conf(str(tmp_path), internal__tls_ca_file=str(cert))
        client = InternalClient(srv.url, SECRET, verify=tls_verify(conf))
        assert client.call("POST", "/echo", {"tls": True}) == {"got": {"tls": True}}
        # Without the CA the server's certificate is not trusted.
        untrusted = InternalClient(srv.url, SECRET, verify=tls_verify(make_conf(str(tmp_path))))
        with pytest.raises(requests.exceptions.SSLError):
            untrusted.call("POST", "/echo", {})
        # A client that connects and never starts the handshake blocks nobody.
        staller = socket.create_connection(("127.0.0.1", srv.port))
        try:
            assert client.call("POST", "/echo", {"while": "stalled"}, timeout=5) == {
                "got": {"while": "stalled"}}
        finally:
            staller.close()
        # Plain HTTP to a TLS server gets nowhere, and the server keeps serving.
        with pytest.raises(requests.RequestException):
            requests.post(srv.url.replace("https", "http") + "/echo", data=b"{}", timeout=5)
        assert client.call("POST", "/echo", {"again": 1}) == {"got": {"again": 1}}
    finally:
        srv.stop()


def test_conductor_url_follows_tls(tmp_path) -> None:
    from acceld.clients.conductor import conductor_url

    assert conductor_url(make_conf(str(tmp_path))).startswith("http://")
    tls = make_conf(str(tmp_path), internal__tls_cert_file="/etc/acceld/cert.pem")
    assert conductor_url(tls).startswith("https://")


class _States:
    """A node's key state that a test changes between a head's check and the call's."""

    def __init__(self) -> None:
        self.now = auth.KeyState()

    def state(self, hostname: str, refresh: bool = False) -> auth.KeyState:
        return self.now


def test_a_head_found_genuine_is_still_checked_in_full_when_served() -> None:
    """The server checks a head before it reads the body (genuine) and the call once it is
    served (check): the second reuses the MAC the first found, and still refuses a
    replay, an expired credential and a key revoked in between."""
    states = _States()
    verifier = auth.Verifier(auth.CloudKeys(SECRET, states), 30)
    key = auth.node_key(SECRET, "node-a")

    def head(now: float | None = None) -> tuple[str, str]:
        sent = auth.headers(key, "POST", "/hello", b"{}", now=now, node="node-a")
        return sent[auth.HEADER], sent[auth.DIGEST_HEADER]

    cred, digest = head()
    assert verifier.genuine("POST", "/hello", cred, "node-a", digest)
    assert verifier.check("POST", "/hello", cred, "node-a", digest).node == "node-a"
    assert verifier.genuine("POST", "/hello", cred, "node-a", digest)  # not first use yet
    with pytest.raises(auth.CredentialError, match="replayed"):
        verifier.check("POST", "/hello", cred, "node-a", digest)

    cred, digest = head()
    assert verifier.genuine("POST", "/hello", cred, "node-a", digest)
    with pytest.raises(auth.CredentialError, match="expired"):
        verifier.check("POST", "/hello", cred, "node-a", digest, now=time.time() + 60)

    cred, digest = head()
    assert verifier.genuine("POST", "/hello", cred, "node-a", digest)
    states.now = auth.KeyState(revoked=True)
    with pytest.raises(auth.KeyRevoked):
        verifier.check("POST", "/hello", cred, "node-a", digest)

    states.now = auth.KeyState()
    cred, digest = head()
    assert verifier.genuine("POST", "/hello", cred, "node-a", digest)
    with pytest.raises(auth.CredentialError, match="wrong credential"):
        verifier.check("POST", "/other", cred, "node-a", digest)  # not the call vouched for
