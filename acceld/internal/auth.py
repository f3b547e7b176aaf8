"""Credentials for internal calls (driver <-> agent <-> conductor, API -> conductor).

Every call carries three headers:

- ``X-Acceld-Credential: <unix time>.<nonce>.<hmac>``;
- ``X-Acceld-Content-SHA256: <hex>``, the hash of the body it sends;
- ``X-Acceld-Node: <hostname>`` when it is signed with a node's key.

The HMAC-SHA256 is taken over the method, path, time, nonce, node, body hash and
the **destination**: the service the call is for, as the client names it
(:data:`CONDUCTOR`, :func:`agent_destination` of a node, :func:`driver_destination`
of a driver process's advertised endpoint). The destination is not sent: each
server checks the MAC against its own name, so a call made for one service is
refused by every other, even one holding the same key (an agent and its node's
driver processes; an agent's ``/hello`` and the conductor's). Because the body hash travels in a header, the whole credential is
checked from the headers before a byte of body is read; the body is then read
(capped) and must hash to what was signed.

Keys: the cloud's secret (``[internal] shared_secret``) is held by controllers
(conductor, API). Each node holds only its own key,
:func:`node_key` (cloud secret, hostname, generation), which the conductor derives when
it needs it: an agent's hello is accepted only for the host whose key signed it,
and the conductor signs its calls to an agent with that agent's key.

Generations: a node's key can be replaced alone (``acceld node-key rotate HOST``)
without touching the cloud's secret. Generation 0 is the key of earlier releases; a
credential made with generation N > 0 says so in a fourth field (``<time>.<nonce>.
<hmac>.<N>``), and a credential without it is generation 0. The deployed form of a
key of generation N > 0 is :func:`format_node_key`'s ``g<N>:<hex>``, so the node is
given one value that carries its generation. A conductor accepts only a node's current
generation (acceld.db.node_keys: the table, read again at least once per ttl), so a
rotated or revoked key is refused within one credential lifetime.

A server accepts a credential once and only within ``[internal] credential_ttl``
seconds of its time. Where its nonces are remembered is a :class:`ReplayGuard`:
in memory by default; for the conductors' shared name :data:`CONDUCTOR` it is the
database (acceld.db.nonces.DatabaseReplay), shared by every conductor on it and
surviving their restarts. Each conductor process also has a name of its own,
:func:`conductor_instance` of a random token drawn at its start, which it announces
in ``X-Acceld-Destination`` on every answer: a client that learned it signs its next
calls to that URL for it. Only that process can accept such a credential (the MAC
covers the name; no other process, nor this one after a restart, draws the same
token), so its nonces are kept in this process's memory: no database write. A server without a database (an agent, a driver process) also
refuses credentials stamped before it started (``not_before``), so a restart does
not reopen the door to what the previous process accepted. It
signs its answer over the request's nonce, status and body
(``X-Acceld-Response``), and the client refuses a successful answer that is
unsigned or does not match: answers cannot be swapped or replayed either.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

HEADER = "X-Acceld-Credential"
NODE_HEADER = "X-Acceld-Node"
DIGEST_HEADER = "X-Acceld-Content-SHA256"
RESPONSE_HEADER = "X-Acceld-Response"
DESTINATION_HEADER = "X-Acceld-Destination"  # a conductor process's own name (announced)

# The shortest secret or node key acceld accepts (characters). Generated ones are longer.
MIN_SECRET_LENGTH = 32

HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_NONCE = re.compile(r"^[0-9a-f]{16,64}\Z")
_GENERATION = re.compile(r"^(0|[1-9][0-9]{0,8})\Z")
_DEPLOYED_KEY = re.compile(r"^g([1-9][0-9]{0,8}):([0-9a-f]{64})\Z")


class CredentialError(Exception):
    """The call is not authenticated; the message says why (for the log, not the caller)."""


class KeyRevoked(CredentialError):
    """The call was signed with a node key that is no longer current (rotated or revoked).

    Raised only once the MAC is verified: the caller holds that key, so it may be told
    why (the 401's description says so), which no forger learns."""


class ReplayUnavailable(Exception):
    """The replay guard cannot say whether a nonce was used (its database is down): the
    call is neither accepted nor called forged (503)."""


class KeysUnavailable(ReplayUnavailable):
    """The node key generations cannot be read (the database is down) and none were read
    before: a node's call is neither accepted nor called forged (503)."""


class ResponseError(Exception):
    """An answer without a valid signature over the request's nonce."""


def node_key(cloud_secret: bytes, hostname: str, generation: int = 0) -> bytes:
    """The key of node ``hostname`` at ``generation``: what the conductor derives and the
    node is given.

    A hex HMAC of the hostname (and the generation, from 1 on) under the cloud's secret,
    so a node's key says nothing of the secret, of any other node's key, or of its own
    other generations. Generation 0 is the key of releases before generations.
    """
    label = b"acceld node key\n" + hostname.encode()
    if generation:
        label += b"\ngeneration %d" % generation
    return hmac.new(cloud_secret, label, hashlib.sha256).hexdigest().encode()


@dataclass(frozen=True)
class NodeKey:
    """A node's key as deployed on the node: the key and the generation it belongs to."""

    key: bytes
    generation: int = 0


def format_node_key(key: bytes, generation: int) -> str:
    """What the operator deploys on a node: the bare hex key at generation 0 (as before
    generations), ``g<N>:<hex>`` from 1 on, so one value carries both."""
    return key.decode() if generation == 0 else f"g{generation}:{key.decode()}"


def parse_node_key(value: str) -> NodeKey:
    """A deployed key's generation and key: ``g<N>:<hex>`` is generation N; any other
    value is a generation-0 key, used as it is."""
    match = _DEPLOYED_KEY.match(value)
    if match is None:
        return NodeKey(value.encode(), 0)
    return NodeKey(match.group(2).encode(), int(match.group(1)))


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# The conductor's destination name: every conductor sharing a database is one service
# (a replay to another is refused by the shared nonce table, not by the name).
CONDUCTOR = "conductor"


# A conductor process's own name: CONDUCTOR, a space and 32 hex digits drawn at its start.
_CONDUCTOR_INSTANCE = re.compile(r"^conductor [0-9a-f]{32}\Z")


def new_conductor_instance() -> str:
    """A fresh name for one conductor process (128 random bits: no other process, and
    not this one's next start, draws it again)."""
    return f"{CONDUCTOR} {secrets.token_hex(16)}"


def is_conductor_instance(name: str | None) -> bool:
    """True for a well-formed :func:`new_conductor_instance` name. A client signs for an
    announced name only then: an answer cannot make it sign a call for an agent or a
    driver process (whose names are of other forms)."""
    return bool(name) and bool(_CONDUCTOR_INSTANCE.match(name))  # type: ignore[arg-type]


def agent_destination(hostname: str) -> str:
    """The destination name of node ``hostname``'s agent."""
    return f"agent {hostname}"


def driver_destination(endpoint: str) -> str:
    """The destination name of the driver process advertising ``endpoint`` (host:port,
    with or without a scheme, as its hello names it)."""
    return "driver " + endpoint.split("://", 1)[-1].rstrip("/")


def _mac(key: bytes, method: str, path: str, stamp: str, nonce: str, node: str | None,
         digest: str, destination: str) -> str:
    message = "\n".join((method.upper(), path, stamp, nonce, node or "", digest,
                         destination)).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signer:
    """Who signs a client's calls: a key, the node it belongs to (None: the cloud's), and
    the key's generation (a node's; 0 is sent as no key id, as before generations)."""

    key: bytes
    node: str | None = None
    generation: int = 0

    def headers(self, method: str, path: str, body: bytes = b"", now: float | None = None,
                destination: str = "") -> tuple[dict[str, str], str]:
        """The credential headers for one call to ``destination``, and its nonce (to check
        the answer with)."""
        stamp = str(int(now if now is not None else time.time()))
        nonce = secrets.token_hex(12)
        digest = body_digest(body)
        mac = _mac(self.key, method, path, stamp, nonce, self.node, digest, destination)
        credential = f"{stamp}.{nonce}.{mac}"
        if self.generation:
            credential += f".{self.generation}"
        headers = {HEADER: credential, DIGEST_HEADER: digest}
        if self.node is not None:
            headers[NODE_HEADER] = self.node
        return headers, nonce

    def check_response(self, nonce: str, status: int, body: bytes,
                       signature: str | None) -> None:
        """ResponseError unless ``signature`` is the server's over this call's answer."""
        if not signature:
            raise ResponseError("the answer is not signed")
        if not hmac.compare_digest(response_mac(self.key, nonce, status, body), signature):
            raise ResponseError("the answer's signature does not match")


def sign(secret: bytes, method: str, path: str, body: bytes = b"",
         now: float | None = None, node: str | None = None, destination: str = "") -> str:
    """A fresh credential header value (the body hash header must go with it: see headers)."""
    return Signer(secret, node).headers(method, path, body, now, destination)[0][HEADER]


def headers(secret: bytes, method: str, path: str, body: bytes = b"",
            now: float | None = None, node: str | None = None,
            destination: str = "") -> dict[str, str]:
    """Every credential header of one call."""
    return Signer(secret, node).headers(method, path, body, now, destination)[0]


def response_mac(key: bytes, nonce: str, status: int, body: bytes) -> str:
    message = "\n".join(("response", nonce, str(status), body_digest(body))).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Keyring(Protocol):
    """The key a server verifies a call with, by the node the call names (None: none) and
    the key generation it claims; and whether that generation is still current."""

    def key_for(self, node: str | None, generation: int = 0) -> bytes | None: ...

    def check_current(self, node: str, generation: int) -> None:
        """KeyRevoked unless ``generation`` is ``node``'s current one (called once the MAC
        made with that generation's key is verified)."""
        ...


@dataclass(frozen=True)
class KeyState:
    """A node's key as the conductors know it: its current generation, and whether even
    that one is revoked (``acceld node-key revoke``: no key of the node is accepted)."""

    generation: int = 0
    revoked: bool = False


class Generations(Protocol):
    """Where a controller reads each node's :class:`KeyState` (acceld.db.node_keys)."""

    def state(self, hostname: str, refresh: bool = False) -> KeyState: ...


def revoked_message(node: str, generation: int, state: KeyState) -> str:
    """Why a node's call made with ``generation`` is refused, for the node's operator."""
    if state.revoked:
        return (f"The key of node {node} is revoked: no key of it is accepted until a "
                f"controller re-keys it with `acceld node-key rotate {node}`.")
    return (f"Generation {generation} of node {node}'s key is revoked; its key is now "
            f"generation {state.generation}: deploy the key `acceld internal node-key "
            f"{node}` prints on a controller.")


_VOUCHED = 4096  # heads found genuine whose call has not been checked yet (Verifier)
_DERIVED_KEYS = 65536  # node keys a controller keeps derived (a node, a generation each)


@dataclass(frozen=True)
class CloudKeys:
    """A controller's keys: the cloud secret, and every node's key derived from it.

    ``generations``: each node's current key generation (None: generation 0 for every
    node, no revocation: a controller without a database)."""

    secret: bytes
    generations: Generations | None = None
    # Node keys derived so far: every signed call of a node needs its key twice (the
    # check before its body is read, the check that serves it), and deriving it was a
    # tenth of an unchanged heartbeat's Python. Bounded: names a stranger makes up
    # empty it when it is full, which costs only derivations.
    _derived: dict[tuple[str, int], bytes] = field(default_factory=dict, compare=False,
                                                   repr=False)

    def key_for(self, node: str | None, generation: int = 0) -> bytes | None:
        if node is None:
            return self.secret
        key = self._derived.get((node, generation))
        if key is None:
            if len(self._derived) >= _DERIVED_KEYS:
                self._derived.clear()
            key = self._derived[(node, generation)] = node_key(self.secret, node, generation)
        return key

    def check_current(self, node: str, generation: int) -> None:
        if self.generations is None:
            state = KeyState()
        else:
            state = self.generations.state(node)
            if generation > state.generation:  # newer than this conductor has read
                state = self.generations.state(node, refresh=True)
        if state.revoked or generation != state.generation:
            if generation > state.generation and not state.revoked:
                # Its MAC is good, so the cloud's secret made it, but not as a key issued.
                raise CredentialError(f"generation {generation} of node {node}'s key was "
                                      f"never issued (current: {state.generation})")
            raise KeyRevoked(revoked_message(node, generation, state))


@dataclass(frozen=True)
class NodeKeys:
    """A node's keys: its own, for calls naming it; nothing else is accepted."""

    hostname: str
    key: bytes
    generation: int = 0

    def key_for(self, node: str | None, generation: int = 0) -> bytes | None:
        if node != self.hostname:
            return None
        if generation != self.generation:
            raise CredentialError(f"made with generation {generation} of node {node}'s "
                                  f"key; this node holds generation {self.generation}")
        return self.key

    def check_current(self, node: str, generation: int) -> None:
        """The node's one key is current by definition (key_for refused any other)."""


@dataclass(frozen=True)
class Identity:
    """Who a verified call came from, and what its answer is signed with."""

    node: str | None
    key: bytes
    nonce: str
    digest: str
    generation: int = 0


@dataclass(frozen=True)
class _Genuine:
    """A credential whose MAC holds (Verifier._genuine): what check() goes on with."""

    key: bytes
    nonce: str
    issued: int
    generation: int
    replay: "ReplayGuard"


class ReplayGuard(Protocol):
    """Where a server remembers the nonces it accepted."""

    def first_use(self, nonce: str, issued: int, now: float) -> bool:
        """Record ``nonce`` (of a credential stamped ``issued``); False if already used."""
        ...


class MemoryReplay:
    """Nonces remembered in this process until their credential expires.

    Forgetting is amortised O(1): nonces are also queued in arrival order and dropped
    from the front once their stamp is older than the ttl (a nonce queued behind a
    newer stamp is kept a little longer, which is only memory). Scanning the whole set
    instead cost 0.5 ms per call at 6,000 live nonces (700 agents beating every 10 s).

    ``margin``: seconds a nonce is kept beyond its credential's expiry. Acceptance and
    forgetting are judged by the same clock (this process's), so 0 is exact while that
    clock does not step back; a margin tolerates a backward step of up to that much
    (the guard a conductor keeps alone uses one ttl, as the shared table does).
    """

    def __init__(self, ttl: int, margin: int = 0) -> None:
        self._ttl = ttl + margin
        self._seen: set[str] = set()
        self._order: collections.deque[tuple[int, str]] = collections.deque()
        self._lock = threading.Lock()

    def first_use(self, nonce: str, issued: int, now: float) -> bool:
        with self._lock:
            horizon = now - self._ttl
            while self._order and self._order[0][0] < horizon:
                self._seen.discard(self._order.popleft()[1])
            if nonce in self._seen:
                return False
            self._seen.add(nonce)
            self._order.append((issued, nonce))
            return True


class Verifier:
    """Checks credentials from the headers: key, destination, age, and first use.

    ``destination``: this server's name (what clients sign for); ``replay``: where
    accepted nonces are remembered (default: this process's memory); ``not_before``:
    refuse credentials stamped earlier (a restarted server without a shared replay
    guard gives this its start time). ``own_destination``: a second name that only
    this process accepts (a conductor's :func:`new_conductor_instance`); credentials
    made for it are remembered in this process's memory alone, for one ttl more than
    they can be accepted.
    """

    def __init__(self, keys: bytes | Keyring, ttl: int = 60, *, destination: str = "",
                 replay: ReplayGuard | None = None, not_before: int | None = None,
                 own_destination: str | None = None) -> None:
        self._keys: Keyring = CloudKeys(keys) if isinstance(keys, bytes) else keys
        self._ttl = ttl
        self.destination = destination
        self._replay: ReplayGuard = replay if replay is not None else MemoryReplay(ttl)
        self.not_before = not_before
        self.own_destination = own_destination
        self._own_replay = MemoryReplay(ttl, margin=ttl)
        # What genuine() found for a head, taken by the check() of the same call when its
        # body has been read: the MAC is computed once per call, not twice (a tenth of an
        # unchanged heartbeat's Python). Only genuine credentials enter; the age, the
        # key's revocation and first use are still judged by check(). Bounded: a call
        # whose body never comes leaves its entry until the dict is emptied when full.
        self._vouched: dict[tuple[str, str, str | None, str | None, str | None, str],
                            _Genuine] = {}

    def check(self, method: str, path: str, credential: str | None, node: str | None,
              digest: str | None, now: float | None = None) -> Identity:
        """Verify a call from its headers alone (the body is checked against ``digest``)."""
        now = now if now is not None else time.time()
        found = self._vouched.pop((method, path, credential, node, digest, self.destination),
                                  None)
        if found is None or abs(now - found.issued) > self._ttl:
            found = self._genuine(method, path, credential, node, digest, now)
        if node is not None:  # before the nonce is taken: a revoked key writes nothing
            self._keys.check_current(node, found.generation)
        if not found.replay.first_use(found.nonce, found.issued, now):
            raise CredentialError("replayed credential")
        return Identity(node, found.key, found.nonce, str(digest), found.generation)

    def genuine(self, method: str, path: str, credential: str | None, node: str | None,
                digest: str | None) -> bool:
        """Whether the headers carry a credential made with a key of this server, fresh,
        for this call: what a server checks before it reads a body for the call. Neither
        revocation nor first use is looked at (no nonce is taken: :meth:`check` does it
        once the call is served)."""
        try:
            found = self._genuine(method, path, credential, node, digest, time.time())
        except CredentialError:
            return False
        if len(self._vouched) >= _VOUCHED:
            self._vouched.clear()
        self._vouched[(method, path, credential, node, digest, self.destination)] = found
        return True

    def _genuine(self, method: str, path: str, credential: str | None, node: str | None,
                 digest: str | None, now: float) -> "_Genuine":
        if not credential:
            raise CredentialError("no credential")
        parts = credential.split(".")
        if len(parts) == 4 and _GENERATION.match(parts[3]):
            generation = int(parts.pop())  # the key id: which generation of a node's key
        else:
            generation = 0  # none: generation 0 (clients from before generations)
        try:
            stamp, nonce, mac = parts
            issued = int(stamp)
        except ValueError:
            raise CredentialError("malformed credential") from None
        if generation and node is None:
            raise CredentialError(f"a key generation without {NODE_HEADER}")
        if not _NONCE.match(nonce) or not _HEX64.match(mac):
            raise CredentialError("malformed credential")
        if not digest or not _HEX64.match(digest):
            raise CredentialError(f"no or malformed {DIGEST_HEADER}")
        if abs(now - issued) > self._ttl:
            raise CredentialError("expired credential")
        if self.not_before is not None and issued < self.not_before:
            raise CredentialError("credential made before this service started")
        if node is not None and not HOSTNAME.match(node):
            raise CredentialError(f"malformed {NODE_HEADER}")
        key = self._keys.key_for(node, generation)
        if key is None:
            raise CredentialError(f"no key here for node {node!r}" if node
                                  else "a node's key is required here")
        if self.own_destination is not None and hmac.compare_digest(
                _mac(key, method, path, stamp, nonce, node, digest, self.own_destination),
                mac):
            replay = self._own_replay  # made for this process alone
        elif hmac.compare_digest(
                _mac(key, method, path, stamp, nonce, node, digest, self.destination), mac):
            replay = self._replay
        else:
            raise CredentialError("wrong credential (another key, or made for another "
                                  "service than " + (self.destination or "this one") + ")")
        return _Genuine(key, nonce, issued, generation, replay)

    def verify(self, method: str, path: str, body: bytes, credential: str | None,
               now: float | None = None, node: str | None = None,
               digest: str | None = None) -> Identity:
        """Headers and body at once (for servers that read the body anyway).

        ``digest`` defaults to the body's own hash, as if the caller had sent it.
        """
        actual = body_digest(body)
        identity = self.check(method, path, credential, node, digest or actual, now)
        if not hmac.compare_digest(identity.digest, actual):
            raise CredentialError("the body does not match its signed hash")
        return identity
