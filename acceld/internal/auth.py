"""Credentials for internal calls (driver <-> agent <-> conductor, API -> conductor).

Every call carries ``X-Acceld-Credential: <unix time>.<nonce>.<hmac>``, an
HMAC-SHA256 with the shared secret over the method, path, time, nonce and a
hash of the body. A server accepts a credential once (nonces are remembered
for the credential's lifetime) and only within ``[internal] credential_ttl``
seconds of its time: a captured call cannot be replayed or altered.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time

HEADER = "X-Acceld-Credential"


class CredentialError(Exception):
    """The call is not authenticated; the message says why (for the log, not the caller)."""


def _mac(secret: bytes, method: str, path: str, stamp: str, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    message = "\n".join((method.upper(), path, stamp, nonce, digest)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, body: bytes = b"",
         now: float | None = None) -> str:
    """A fresh credential for one call. ``path`` includes the query string, if any."""
    stamp = str(int(now if now is not None else time.time()))
    nonce = secrets.token_hex(12)
    return f"{stamp}.{nonce}.{_mac(secret, method, path, stamp, nonce, body)}"


class Verifier:
    """Checks credentials and remembers the nonces it accepted until they expire."""

    def __init__(self, secret: bytes, ttl: int = 60) -> None:
        self._secret = secret
        self._ttl = ttl
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, method: str, path: str, body: bytes, credential: str | None,
               now: float | None = None) -> None:
        if not credential:
            raise CredentialError("no credential")
        try:
            stamp, nonce, mac = credential.split(".")
            issued = int(stamp)
        except ValueError:
            raise CredentialError("malformed credential") from None
        now = now if now is not None else time.time()
        if abs(now - issued) > self._ttl:
            raise CredentialError("expired credential")
        expected = _mac(self._secret, method, path, stamp, nonce, body)
        if not hmac.compare_digest(expected, mac):
            raise CredentialError("wrong credential")
        with self._lock:
            if nonce in self._seen:
                raise CredentialError("replayed credential")
            self._seen[nonce] = issued
            if len(self._seen) > 4096:
                self._forget_expired(now)

    def _forget_expired(self, now: float) -> None:
        horizon = now - self._ttl
        for nonce in [n for n, t in self._seen.items() if t < horizon]:
            del self._seen[nonce]
