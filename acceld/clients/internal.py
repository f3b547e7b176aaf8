"""HTTP between acceld's own services, every call signed (see acceld.internal.auth).

A successful answer must carry the server's signature over the call's nonce;
an unsigned or mismatched one is refused (InternalError 502), so an answer
cannot be swapped or replayed on the wire. An error answer without a signature
(a 401 or 413 from a server that could not authenticate the call) is still
reported with its status.

A client of the conductors (``learn_destination``) signs its first call to a URL
for the conductors' shared name (a nonce in the shared database table) and then
for the name the conductor that answered announced as its own (nonces kept in
that process's memory: no database write per call). When a call made for the
learned name is refused by the credential check (401 without a signed answer:
nothing ran), the conductor at that URL is another process (restarted, or a load
balancer chose another), and the call is sent once more for the shared name; the
URL then stays on the shared name for :data:`SHARED_AFTER_REFUSAL` seconds, so a
load balancer that spreads single calls costs one refusal per that time, not one
per call.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any
from urllib.parse import urlsplit

import orjson
import requests

from acceld import request_ids
from acceld.clients import deadline as deadlines
from acceld.internal import auth


# Seconds a conductor URL whose learned name was refused keeps to the shared name.
SHARED_AFTER_REFUSAL = 60.0
# Bytes of an answer's body read at a time by :meth:`InternalClient.fetch`.
READ_CHUNK = 64 * 1024


def tls_verify(conf) -> str | bool:  # type: ignore[no-untyped-def]
    """How internal clients verify TLS servers: ``[internal] tls_ca_file``, else system CAs."""
    return conf.internal.tls_ca_file or True


def scheme(conf) -> str:  # type: ignore[no-untyped-def]
    """``https`` when the internal servers are configured with a certificate."""
    return "https" if conf.internal.tls_cert_file else "http"


def internal_url(conf, endpoint: str) -> str:  # type: ignore[no-untyped-def]
    """An advertised ``host:port`` (or full URL) as a URL with the internal scheme."""
    return endpoint if "://" in endpoint else f"{scheme(conf)}://{endpoint}"


class InternalError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class AnswerTooLarge(requests.RequestException):
    """The answer's body is over the caller's cap (declared or as it arrived): it was
    not read further."""

    def __init__(self, max_bytes: int, read: int) -> None:
        super().__init__(f"answer over {max_bytes} bytes ({read} bytes of body read)")
        self.max_bytes = max_bytes
        self.read = read


class InternalClient:
    """Signed JSON calls to one internal server (a driver, an agent or the conductor)."""

    def __init__(self, base_url: str, secret: bytes | auth.Signer, *,
                 timeout: float | tuple[float, float] = 10.0,
                 verify: str | bool = True, node: str | None = None,
                 destination: str = "", learn_destination: bool = False,
                 deadline: float | None = None) -> None:
        """``secret``: the key to sign with; ``node``: the node it belongs to (None: the
        cloud's secret). A :class:`auth.Signer` gives both. ``destination``: the service
        at ``base_url`` (auth.CONDUCTOR, auth.agent_destination(host), ...): the
        credential is good there only. ``learn_destination``: sign for the name the
        server announces as its own once it has answered (conductors; see the module).
        ``timeout``: seconds (or (connect, read)) for each attempt; ``deadline``: seconds
        each call may take in all, however slowly the server answers (None: unbounded;
        acceld.clients.deadline)."""
        if "://" not in base_url:
            base_url = f"http://{base_url}"
        self.base_url = base_url.rstrip("/")
        self._prefix = urlsplit(self.base_url).path
        self._signer = secret if isinstance(secret, auth.Signer) else auth.Signer(secret, node)
        self._timeout = timeout
        self._verify = verify
        self.destination = destination
        self._learn = learn_destination
        self.learned: str | None = None  # the announced name calls are signed for now
        self._shared_until = 0.0  # monotonic: no learning before (after a refusal)
        self._session = deadlines.watch(requests.Session())
        self.deadline = deadline

    def call(self, method: str, path: str, body: Any = None, *,
             timeout: float | tuple[float, float] | None = None,
             signer: auth.Signer | None = None, deadline: float | None = None) -> Any:
        """Send ``body`` as JSON; return the decoded answer (None when empty).

        Raises InternalError for an error status or an answer without a valid
        signature, requests.RequestException when unreachable, its subclass
        deadline.DeadlinePassed when ``deadline`` (else the client's) ran out.
        """
        with self._bounded(deadline):
            return self._call(method, path, body, timeout, signer)

    def fetch(self, path: str, *, max_bytes: int) -> tuple[requests.Response, str]:
        """GET ``path`` and return the answer as it came, with the call's nonce: the caller
        judges its status and signature (:meth:`auth.Signer.check_response`). The body is
        read as it arrives to at most ``max_bytes`` (:class:`AnswerTooLarge` past it, or
        when its Content-Length says so, nothing more read), within the client's deadline.
        For an answer a peer may make huge (a node's hardware report)."""
        with self._bounded(None):
            resp, nonce = self._send("GET", path, b"", False, self._signer, self.destination,
                                     None, stream=True)
            with resp:
                resp._content = _read_capped(resp, max_bytes)
            return resp, nonce

    def _bounded(self, deadline: float | None) -> contextlib.AbstractContextManager[Any]:
        total = deadline or self.deadline
        if total is None:
            return contextlib.nullcontext()
        return deadlines.bounded(total, self.base_url)

    def _call(self, method: str, path: str, body: Any,
              timeout: float | tuple[float, float] | None,
              signer: auth.Signer | None) -> Any:
        data = orjson.dumps(body) if body is not None else b""
        signer = signer or self._signer  # one client may speak for several nodes (simulate)
        learned = self.learned
        resp, nonce = self._send(method, path, data, body is not None, signer,
                                 learned or self.destination, timeout)
        if learned is not None and resp.status_code == 401 \
                and auth.RESPONSE_HEADER not in resp.headers:
            # Refused before anything ran: another process answers this URL now.
            self.learned = None
            self._shared_until = time.monotonic() + SHARED_AFTER_REFUSAL
            resp, nonce = self._send(method, path, data, body is not None, signer,
                                     self.destination, timeout)
        signature = resp.headers.get(auth.RESPONSE_HEADER)
        if signature is not None or resp.status_code < 400:
            try:
                signer.check_response(nonce, resp.status_code, resp.content, signature)
            except auth.ResponseError as exc:
                raise InternalError(502, f"Refused the answer of {self.base_url}{path}: "
                                         f"{exc}") from None
        if resp.status_code >= 400:
            raise InternalError(resp.status_code, resp.text[:500])
        if self._learn:
            self._learn_from(resp.headers.get(auth.DESTINATION_HEADER))
        return orjson.loads(resp.content) if resp.content else None

    def _send(self, method: str, path: str, data: bytes, is_json: bool, signer: auth.Signer,
              destination: str, timeout: float | tuple[float, float] | None,
              stream: bool = False) -> tuple[requests.Response, str]:
        headers, nonce = signer.headers(method, self._prefix + path, data,
                                        destination=destination)
        if is_json:
            headers["Content-Type"] = "application/json"
        # The request (or bind job) this call is made for, so the server's lines name it.
        headers.update(request_ids.outgoing_headers())
        # No redirect is followed: an internal server never sends one, and a peer's would
        # carry the signed call (a node's endpoint, to wherever it points).
        resp = self._session.request(method, self.base_url + path, data=data, headers=headers,
                                     timeout=timeout or self._timeout, verify=self._verify,
                                     allow_redirects=False, stream=stream)
        return resp, nonce

    def _learn_from(self, announced: str | None) -> None:
        """Sign the next calls for the name a signed, successful answer announced: only a
        conductor instance's name (never an agent's or a driver's), and not while this
        URL keeps to the shared name after a refusal."""
        if announced == self.learned or not auth.is_conductor_instance(announced):
            return
        if time.monotonic() >= self._shared_until:
            self.learned = announced

    def close(self) -> None:
        self._session.close()


def _read_capped(resp: requests.Response, max_bytes: int) -> bytes:
    """A streamed answer's body, read to at most one chunk past ``max_bytes``."""
    length = resp.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise AnswerTooLarge(max_bytes, 0)
    body = bytearray()
    for chunk in resp.iter_content(READ_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise AnswerTooLarge(max_bytes, len(body))
    return bytes(body)
